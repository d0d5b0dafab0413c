"""Settings of one evaluation: trials, limits, tolerances, timing method.

`EvalOptions` travels from the worker to its runner subprocess inside the job frame, so it is a
msgspec struct of plain values. Every limit named in an error message ("... (EvalOptions.timeout_s)")
is a field here.
"""
from __future__ import annotations

import msgspec

# Bumped whenever the way a call is timed changes (part of the reference-timing cache key).
TIMING_METHOD = "m2"


class EvalOptions(msgspec.Struct, kw_only=True, frozen=True):
    """How to validate and profile a candidate. Defaults follow KernelBench where it is sound."""

    # --- correctness
    trials: int = 5                         # correctness trials, each with a fresh seed
    seed: int | None = None                 # base seed; None draws a fresh one per evaluation
    atol: float | None = None               # override the per-dtype absolute tolerance
    rtol: float | None = None               # override the per-dtype relative tolerance
    second_shape: bool = True               # re-run on perturbed input shapes when the problem allows it
    randomized_params: bool = True          # a trial with random parameters loaded into both models

    # --- profiling
    warmup: int = 3                         # untimed calls before the timed ones
    timing_trials: int = 50                 # timed calls; the first is dropped
    input_sets: int = 4                     # distinct input sets rotated through the timed calls
    l2_flush_mb: int = 256                  # buffer overwritten before each timed call
    compile_baseline: bool = False          # also time torch.compile(Model) as a second baseline
    cache_ref_timing: bool = True           # reuse the reference's timing per problem/device/settings
    floor_check: bool = True                # flag speedups beyond the memory-bandwidth/compute floor
    peak_bandwidth_gbs: float | None = None  # override the device's peak memory bandwidth (GB/s)
    peak_tflops: float | None = None        # override the device's peak rate for the problem's dtype

    # --- limits
    timeout_s: float = 300.0                # wall clock for one candidate's run subprocess
    build_timeout_s: float = 900.0          # wall clock for one candidate's extension build
    spawn_timeout_s: float = 120.0          # a spare process must be ready within this
    memory_limit_mb: int = 8192             # host memory a candidate may add on top of the runner's
    gpu_memory_fraction: float = 0.9        # share of the GPU's memory the runner may allocate

    # --- isolation (eval/sandbox.py)
    sandbox: str = "required"               # "required": refuse candidates where no sandbox can be
    #                                         made; "optional": run them unsandboxed there (labelled
    #                                         sandbox "none"); "off": never sandbox (trusted code only)
    scratch_mb: int = 1024                  # size of a sandboxed run's private /tmp
    max_processes: int = 512                # processes and threads a sandboxed run may have

    # --- where
    cache_dir: str | None = None            # shared build and reference-timing cache; None: work_dir/cache
    problem_scale: str = "auto"             # SPECGEN_PROBLEM_SCALE for the problem: auto = small on CPU

    def resolved_scale(self, device: str) -> str:
        if self.problem_scale != "auto":
            return self.problem_scale
        return "small" if device == "cpu" else "full"

    def timing_key(self) -> str:
        """The settings a reference timing depends on (part of its cache key)."""
        # TIMING_METHOD: a timing taken by an older method is never reused.
        return (f"{TIMING_METHOD}-w{self.warmup}-t{self.timing_trials}-s{self.input_sets}-l2{self.l2_flush_mb}"
                f"-c{int(self.compile_baseline)}")
