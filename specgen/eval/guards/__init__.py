"""Every defence of the verdict, and the reward hack each one stops.

The verdict rests on the judge (eval/judge.py) and the reference runner, processes the candidate
never runs in: the reference runner makes the inputs (fresh, unpredictable seeds per call), hands
them over and reads the outputs itself in its arena (eval/arena.py), judging them against its own
call and the accurate value; the judge measures every time on its own clock. Most hacks therefore need no guard of their own: they simply fail
the comparison (wrong, stale, lazy or unwritten outputs), or gain nothing (a swapped clock, a
thread finishing after `forward` returns, memoization across calls that never see the same
inputs). What is left are the checks below. A flag (`Verdict.flags`, `"<code>: <reason>"`)
rejects the candidate.

The candidate's runner reports evidence of its own kernels (launch counts, kernel errors, builds):
that can only reject, never accept (a candidate that inflates its count gains nothing the judge
does not check). No check reads the candidate's source: what a pattern in the source could hide,
the judge's measurements do not depend on.

Importing this package does not import torch (`specgen.eval` exports `FLAG_CODES` from here).
"""
from __future__ import annotations

from typing import NamedTuple

# code -> what it means; tests and callers match on the code before the colon.
FLAG_CODES: dict[str, str] = {
    "custom-kernel-not-run": "the custom kernel it defines never ran (failed build, fallback taken)",
    "kernel-error-fallback": "its kernel raised and the candidate carried on without it",
    "tensor-subclass": "the output is not a plain torch.Tensor",
    "mutated-inputs": "the call changed its input tensors, which the problem's Model does not do",
    "memoized": "the output did not follow its inputs refilled in place (cached by pointer, shape or call)",
    "hard-coded-shape": "fails on a second input shape the problem allows",
    "parameter-mismatch": "its parameters do not line up with the reference's",
    "initial-params-only": "matches the reference only at the initial parameter values",
    "beyond-floor": "faster than the device's memory-bandwidth or compute floor allows",
}


def flag_code(flag: str) -> str:
    """The code of a flag string ("memoized: ..." -> "memoized")."""
    return flag.split(":", 1)[0]


class Guard(NamedTuple):
    where: str      # "module:qualname" under specgen.eval
    flags: str      # the codes it raises, space-separated; "" when a hack just fails the comparison
    stops: str      # the reward hack it stops


GUARDS: tuple[Guard, ...] = (
    # --- the judge's own steps, over the reference runner's arena (eval/arena.py)
    Guard("exchange:Exchange.hand", "",
          "memoized or precomputed outputs: every call's inputs are made by the reference runner "
          "from a fresh seed and handed over as the window opens, into the same memory"),
    Guard("runner:ReferenceRole.read", "",
          "wrong, stale, unwritten, NaN, near-zero, constant or lazy outputs, and outputs served "
          "later: the reference runner reads the arena itself and judges what the call left"),
    Guard("runner:ReferenceRole.look", "",
          "work finishing after the reply (threads, side streams, a reply sent early): a timed "
          "call's window ends when the outputs are read, and outputs that change between the two "
          "readings fail"),
    Guard("output_checks:OutputChecks.called", "tensor-subclass",
          "sizes, counts and dtypes no output has: bounded by the arena before anything is read"),
    Guard("exchange:Exchange.timed", "",
          "a swapped clock, events or synchronize, stage messages of its own: one window, from the "
          "judge's handing over to the kernel's stamp on the reference runner's reading"),
    Guard("profiling:Profiler.nothing", "",
          "the judge's own costs: the same path with no call, timed in the candidate's runner "
          "before its code was loaded, subtracted for both sides"),
    Guard("output_checks:OutputChecks.judged", "mutated-inputs",
          "inputs zeroed, overwritten or computed into: the reference runner re-reads the inputs "
          "it handed over against those it kept"),
    Guard("profiling:Profiler._timed_calls", "",
          "behaving only until timed: every timed call read, some compared in full, chosen after "
          "the call; timed and checked calls look the same to the candidate"),
    Guard("probes:Probes._memo_probe", "memoized",
          "a result cached by data pointer or shape: the same tensors refilled with new values"),
    Guard("probes:Probes._second_shape", "hard-coded-shape",
          "kernels hard-coded to the one input shape the problem uses"),
    Guard("probes:Probes._randomized_params", "parameter-mismatch initial-params-only",
          "wrong-shape parameters, and outputs baked in for the initial weights"),
    Guard("probes:Probes.kernels_ran", "custom-kernel-not-run",
          "an extension that failed to build, or kernels that never run, with PyTorch doing the "
          "work (a fallback only counts when it ran)"),
    Guard("profiling:Profiler._floor", "beyond-floor",
          "a time below what memory bandwidth and compute allow"),
    Guard("compare:compare_tensor", "",
          "precision lowered beyond the problem's (TF32, half precision): outputs are compared "
          "with a float64 reference, allowing only the problem's own error"),
    # --- evidence from the candidate's runner (reject-only)
    Guard("guards.dynamic:LaunchCounter", "custom-kernel-not-run kernel-error-fallback",
          "Triton kernels that never launch, or raise while the call carries on in PyTorch"),
    Guard("extensions:CountingModule", "custom-kernel-not-run kernel-error-fallback",
          "extension functions never called, or raising while the call carries on"),
    Guard("extensions:install", "custom-kernel-not-run",
          "an extension that never builds with a silent fallback (failed builds are recorded)"),
    # --- isolation: the problem's module and the candidate's are never one namespace
    Guard("loader:exec_source", "",
          "a candidate's module constants changing the problem's input shapes (KernelBench "
          "executes both in one namespace)"),
)
