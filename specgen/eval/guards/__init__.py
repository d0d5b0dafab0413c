"""Every defence of the verdict, and the reward hack each one stops.

The verdict rests on the judge (eval/judge.py), a process the candidate never runs in: it makes
the inputs (fresh, unpredictable seeds per call), has the reference runner compute the accurate
value and compare the candidate's whole output with it, checks every call's digest, measures
every time on its own clock. Most hacks therefore need no guard of their own: they simply fail
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
    # --- the judge's own steps
    Guard("inputs:Inputs.trial", "",
          "memoized or precomputed outputs: every call's inputs come from a fresh seed the "
          "candidate learns only with the request"),
    Guard("output_checks:OutputChecks.checked", "tensor-subclass",
          "wrong, stale, unwritten, NaN, near-zero or lazy outputs: the whole output, copied out, "
          "compared by the reference with its accurate value"),
    Guard("output_checks:OutputChecks.digests_differ", "",
          "work finishing after the call returned (threads, side streams), outputs changing "
          "after the call: the digest read as the call returned must match"),
    Guard("exchange:Exchange.timed", "",
          "a swapped clock, events or synchronize: times are the judge's, from its request to "
          "the kernel's timestamp on the reply"),
    Guard("profiling:Profiler.nothing", "",
          "the judge's own costs: the same path timed with no call in the reference runner, "
          "subtracted for both sides; for the candidate at most what the reference's own "
          "timing found (a candidate that loads the host between its calls gains nothing)"),
    Guard("output_checks:OutputChecks.inputs_unchanged", "mutated-inputs",
          "inputs zeroed or overwritten (a reference run on the same tensors would agree; a "
          "caller's data is clobbered): every call's inputs are digested after it"),
    Guard("output_checks:OutputChecks.ship_timed", "",
          "behaving only until timed: timed calls' digests, and some timed outputs compared in "
          "full, chosen after the call"),
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
