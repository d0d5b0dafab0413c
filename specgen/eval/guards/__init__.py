"""Every cheat guard of the evaluation, and the reward hack each one stops.

A guard either flags (`Verdict.flags`, `"<code>: <reason>"`; any flag rejects the candidate) or
arranges the run so that a hack fails the ordinary correctness check. Where they live:

* `static`: the source scan, run by the worker before any of the candidate's code runs (and again
  in the runner, for callers that run a job directly);
* `runtime`: instrumentation installed in the runner before the candidate's module executes;
* `probes`: checks that run the candidate (next to the reference) and read what happened;
* a few stay in the evaluation's flow (`harness.Evaluation`), in the comparison (`compare`), the
  timer (`timing`), the loader and the extension machinery (`extensions`), where they are one
  step of doing the work itself. `GUARDS` names them all.

Isolation is not listed: the sandbox (`sandbox.py`, `namespaces.py`), one runner process per
candidate (`runner_process.py`) and the scrubbing of what a run reports (`redact.py`) protect everything
outside the run, not the run's own verdict.

Importing this package does not import torch (`specgen.eval` exports `FLAG_CODES` from here).
"""
from __future__ import annotations

from typing import NamedTuple

# code -> what it means; tests and callers match on the code before the colon.
FLAG_CODES: dict[str, str] = {
    "try-fallback": "errors swallowed by try/except: a fallback path can hide a failing kernel",
    "timer-patch": "timers, events or synchronization replaced",
    "monkey-patch": "attributes of an imported module replaced",
    "thread": "work started on other threads or processes",
    "side-stream": "work launched on a CUDA stream other than the current one",
    "lazy-tensor": "a tensor subclass or dispatch hook that can defer or fake work",
    "memoized": "results cached across calls (by value, shape or data pointer)",
    "precision": "precision lowered beyond the problem's tolerance or global precision changed",
    "introspection": "reads outside its own module (frames, gc, sys.modules, ctypes)",
    "custom-kernel-not-run": "the custom kernel it defines never ran (failed build, fallback)",
    "kernel-error-fallback": "its kernel raised and the candidate carried on without it",
    "same-output-buffer": "the same output storage returned on every call",
    "output-aliases-input": "the output shares memory with an input",
    "output-aliases-persistent": "the output shares memory with the module's own tensors",
    "mutated-inputs": "inputs changed by the call",
    "tensor-subclass": "the output is not a plain torch.Tensor",
    "hard-coded-shape": "fails on a second input shape the problem allows",
    "parameter-mismatch": "its parameters do not line up with the reference's",
    "initial-params-only": "matches the reference only at the initial parameter values",
    "reads-reference-output": "its output is the reference's output tensor",
    "problem-namespace": "the problem's module was changed",
    "beyond-floor": "faster than the device's memory-bandwidth or compute floor allows",
}


def flag_code(flag: str) -> str:
    """The code of a flag string ("side-stream: ..." -> "side-stream")."""
    return flag.split(":", 1)[0]


class Guard(NamedTuple):
    where: str      # "module:qualname" under specgen.eval
    flags: str      # the codes it raises, space-separated; "" when a hack just fails the comparison
    stops: str      # the reward hack it stops


GUARDS: tuple[Guard, ...] = (
    # --- before anything runs
    Guard("guards.static:scan_source",
          "try-fallback timer-patch monkey-patch thread side-stream lazy-tensor memoized precision "
          "introspection",
          "known hacks visible in the source, C++/CUDA strings included (refused unexecuted)"),
    # --- installed in the runner before the candidate's module executes
    Guard("guards.dynamic:Sentinels", "timer-patch monkey-patch problem-namespace",
          "patched timers, events, synchronize, torch ops, nn classes or the problem's module"),
    Guard("guards.dynamic:precision_state", "precision",
          "global precision lowered: TF32, reduced-precision reductions, autocast, default dtype"),
    Guard("guards.dynamic:LaunchCounter", "custom-kernel-not-run kernel-error-fallback",
          "Triton kernels that never launch, or raise while the call carries on in PyTorch"),
    Guard("guards.dynamic:ThreadCounter", "thread", "work moved to threads the timer does not see"),
    Guard("extensions:install", "custom-kernel-not-run",
          "an extension that never builds with a silent fallback (failed builds are recorded)"),
    Guard("extensions:CountingModule", "custom-kernel-not-run kernel-error-fallback",
          "extension functions never called, or raising while the call carries on"),
    Guard("loader:exec_source", "",
          "a candidate rewriting the problem's globals: each runs in a module of its own"),
    # --- probes, run by the flow after the correctness trials (and some on every trial)
    Guard("guards.probes:check_globals", "timer-patch monkey-patch problem-namespace precision",
          "patches and precision changes made at load or during any call (put back after)"),
    Guard("guards.probes:trial_guards",
          "mutated-inputs output-aliases-input output-aliases-persistent reads-reference-output "
          "same-output-buffer",
          "outputs that are an input, a kept tensor, the reference's output or the previous "
          "call's buffer; overwritten inputs"),
    Guard("guards.probes:memo_probe", "memoized",
          "memoized outputs: the same input buffers refilled with new values return stale results"),
    Guard("guards.probes:second_shape_trial", "hard-coded-shape kernel-error-fallback",
          "kernels hard-coded to the one input shape the problem uses"),
    Guard("guards.probes:randomized_params_trial", "parameter-mismatch initial-params-only",
          "wrong-shape parameters, and outputs baked in for the initial weights"),
    Guard("guards.probes:kernels_ran", "custom-kernel-not-run",
          "an extension that fails to build, or kernels that never run, with PyTorch doing the work"),
    Guard("guards.probes:profiler_probe", "side-stream custom-kernel-not-run",
          "side-stream timing (kernels on streams the events miss); only the reference's kernels"),
    Guard("guards.probes:floor_check", "beyond-floor",
          "a time below what memory bandwidth and compute allow (work hidden from the timer)"),
    # --- steps of the flow itself
    Guard("harness:Evaluation._correctness_trials", "problem-namespace",
          "reading this trial's reference output or inputs: fresh seeds, a clone per model, "
          "the candidate first; get_inputs changed from outside"),
    Guard("harness:Evaluation.poison", "",
          "an output never written passing on stale memory: free blocks are filled with NaN"),
    Guard("harness:Evaluation.call_candidate", "kernel-error-fallback thread",
          "a kernel error swallowed inside the call; threads started by a call"),
    Guard("harness:Evaluation.compare_outputs", "tensor-subclass precision",
          "lazy tensor subclasses as outputs; precision downgrade (right only at fp16 tolerance)"),
    Guard("compare:compare", "",
          "NaN/Inf outputs, and near-zero outputs passing on the absolute tolerance alone"),
    Guard("harness:Evaluation._profile", "thread",
          "memoizing across timed calls (input sets rotated); behaving only until timed "
          "(output checked again after timing)"),
    Guard("timing:Timer.time", "",
          "side-stream work and host time hidden from the events: device-wide synchronize, L2 flush"),
    Guard("harness:Evaluation._time_reference", "",
          "a slowed-down reference: its cached timing comes from a runner no candidate ran in"),
)
