"""One candidate's evaluation, inside a runner subprocess: load, check, probe, time.

The order matters and is part of the guards:
* the problem's module is executed first, in its own namespace; then the instrumentation (load_inline
  interception, launch and thread counters, identity snapshots of trusted functions); then the
  candidate's module, in a namespace of its own;
* both models are built from the same fresh seed; every trial draws fresh inputs from a fresh
  seed and gives each model its own clone; the candidate runs first, on an allocator whose free
  blocks were filled with NaN, so an output it never writes shows, and so it cannot find the
  reference's output of the same trial in memory;
* then the probes (`specgen.eval.guards.probes`, with every other guard listed in
  `specgen.eval.guards`): inputs refreshed in place (memoization by pointer), randomized parameters
  loaded into both models, a second input shape, whether its own kernels ran, and on a GPU the
  kernels and streams a profiler sees;
* timing runs only for a candidate that passed, and its output is checked once more afterwards.
Anything the candidate does goes into the verdict; nothing it does may raise out of here.
"""
from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any, Callable

import torch

from specgen.eval import extensions
from specgen.eval.compare import compare, flatten
from specgen.eval.extensions import KernelLedger
from specgen.eval.guards import probes
from specgen.eval.guards.dynamic import LaunchCounter, Sentinels, ThreadCounter, precision_state
from specgen.eval.guards.static import scan_source
from specgen.eval.loader import candidate_from_text, exec_source, problem_from_text
from specgen.eval.timing import Timer
from specgen.messages import RefTiming, RunJob, RunResult, Verdict


class _Stop(Exception):
    """Evaluation cannot go on (the verdict already says why)."""


def evaluate_run_job(job: RunJob, device: str, device_name: str) -> RunResult:
    evaluation = Evaluation(job, device, device_name)
    try:
        with torch.no_grad():
            evaluation.run()
    except _Stop:
        pass
    except BaseException as exc:  # noqa: BLE001 - a candidate may raise anything, even SystemExit
        evaluation.fail(f"evaluation stopped: {type(exc).__name__}: {exc}")
    return evaluation.result()


class Evaluation:
    def __init__(self, job: RunJob, device: str, device_name: str) -> None:
        self.job = job
        self.options = job.options
        self.device = device
        self.device_name = device_name
        self.cuda = device.startswith("cuda")
        self.verdict = Verdict(stage=job.stage, device=job.reported_device, cpu_timing=not self.cuda)
        self.seconds: dict[str, float] = {}
        self.flags: dict[str, str] = {}
        self.notes: list[str] = []
        self.new_ref_timing: RefTiming | None = None
        self.ledger = KernelLedger()
        self.threads = ThreadCounter()
        self.launches = 0
        self.max_abs = 0.0
        self.max_rel = 0.0
        self.compared = False
        seed = self.options.seed
        self.base_seed = seed if seed is not None else random.SystemRandom().randrange(1, 2**31 - 1)
        self.out_nbytes: list[int] = []

    # ------------------------------------------------------------------ verdict helpers
    def fail(self, error: str) -> None:
        if self.verdict.error is None:
            if "can't allocate memory" in error or "MemoryError" in error or \
                    "out of memory" in error:
                error += (" (the runner's memory is capped by EvalOptions.memory_limit_mb and, "
                          "on a GPU, EvalOptions.gpu_memory_fraction)")
            self.verdict.error = error[:4000]

    def flag(self, flag: str) -> None:
        code = flag.split(":", 1)[0]
        self.flags.setdefault(code, flag[:1000])

    def result(self) -> RunResult:
        v = self.verdict
        v.flags = list(self.flags.values())
        if self.compared:
            v.max_abs_error, v.max_rel_error = self.max_abs, self.max_rel
        if v.flags or v.error:
            v.correct = False
        v.notes = self.notes
        v.stage_seconds = {k: round(s, 4) for k, s in self.seconds.items()}
        return RunResult(verdict=v, ref_timing=self.new_ref_timing)

    def _timed(self, key: str) -> "_Clock":
        return _Clock(self.seconds, key)

    # ------------------------------------------------------------------ setup
    def run(self) -> None:
        if self.job.stage == "reference":
            self._time_reference()
            return
        with self._timed("load"):
            self._load()
        stage = self.job.stage
        if stage in ("validate", "full"):
            with self._timed("correctness"):
                self._correctness_trials()
            with self._timed("guards"):
                self._probes()
            probes.check_globals(self)
            self.verdict.correct = not self.flags and self.verdict.error is None
        if stage == "profile":
            with self._timed("correctness"):
                self._single_check("re-check before timing")
            probes.check_globals(self)
            self.verdict.correct = not self.flags and self.verdict.error is None
        if stage in ("profile", "full") and self.verdict.correct:
            self._profile()

    def _load_problem(self) -> None:
        job = self.job
        os.environ["SPECGEN_PROBLEM_SCALE"] = self.options.resolved_scale(
            "cuda" if self.cuda else "cpu")
        problem = problem_from_text(job.problem_source, name=job.problem_name)
        try:
            self.problem = exec_source(problem, f"specgen_problem_{problem.sha256[:12]}",
                                       Path(job.job_dir))
            self.get_inputs: Callable[[], Any] = self.problem.get_inputs
            self.seed(self.base_seed - 1)
            self.init_inputs = list(self.problem.get_init_inputs())
        except BaseException as exc:  # noqa: BLE001
            self.fail(f"problem {job.problem_name} failed to load: {type(exc).__name__}: {exc}")
            raise _Stop from None

    def _make_reference(self) -> None:
        try:
            self.seed(self.base_seed)
            self.ref = self.problem.Model(*self.init_inputs).to(self.device)
        except BaseException as exc:  # noqa: BLE001
            self.fail(f"problem {self.job.problem_name}: Model(*get_init_inputs()) raised "
                      f"{type(exc).__name__}: {exc}")
            raise _Stop from None

    def _time_reference(self) -> None:
        """Stage "reference": the problem alone, timed in a process no candidate ever ran in,
        so the timing the worker caches for every later candidate is one no candidate touched."""
        with self._timed("load"):
            self._load_problem()
            self._make_reference()
        sets = self._input_sets()
        ref_sets = [self.clone(s) for s in sets]
        timer = Timer(self.device, self.options.l2_flush_mb)
        with self._timed("ref_timing"):
            stats = timer.time(lambda ins: self.ref(*ins), ref_sets, self.options.warmup,
                               self.options.timing_trials)
            compiled_ms = self._time_compiled(timer, ref_sets)
        self.verdict.ref_ms, self.verdict.ref_compiled_ms = stats.median_ms, compiled_ms
        self.new_ref_timing = RefTiming(ref_ms=stats.median_ms, ref_spread=stats.spread,
                                        ref_compiled_ms=compiled_ms, samples=stats.samples)

    def _load(self) -> None:
        job = self.job
        job_dir = Path(job.job_dir)
        self.candidate = candidate_from_text(job.candidate_source)
        self._load_problem()
        # The worker already refused a candidate with static flags before starting it; they are
        # checked again here for callers that run a job directly.
        for flag in scan_source(self.candidate.tree):
            self.flag(flag)
        if self.flags:
            raise _Stop
        extensions.install("run", Path(job.cache_dir), Path(job.build_dir), self.ledger,
                           scope=self.candidate.sha256)
        LaunchCounter(self.ledger).install()
        self.threads.install()
        self.precision0 = precision_state()
        self.sentinels = Sentinels(extra=[("problem module", self.problem),
                                          ("problem Model", self.problem.Model)])
        try:
            module = exec_source(self.candidate, f"specgen_candidate_{self.candidate.sha256[:12]}",
                                 job_dir)
            model_new = module.ModelNew
        except BaseException as exc:  # noqa: BLE001
            self.fail(f"candidate failed to load: {type(exc).__name__}: {exc}"
                      + self._build_errors())
            raise _Stop from None
        probes.check_globals(self)
        seed = self.base_seed
        self._make_reference()
        try:
            self.seed(seed)
            self.cand = model_new(*self.init_inputs)
            if isinstance(self.cand, torch.nn.Module):
                self.cand = self.cand.to(self.device)
        except BaseException as exc:  # noqa: BLE001
            self.fail(f"ModelNew(*get_init_inputs()) raised {type(exc).__name__}: {exc}"
                      + self._build_errors())
            self.sync_or_stop()
            raise _Stop from None
        probes.check_globals(self)
        self.verdict.compiled = True

    def _build_errors(self) -> str:
        failed = [b for b in self.ledger.builds if not b.ok]
        return "".join(f"; extension {b.name} failed to build: {b.error}" for b in failed)

    def seed(self, seed: int) -> None:
        random.seed(seed)
        torch.manual_seed(seed)
        try:
            import numpy as np
            np.random.seed(seed % (2**32))
        except ImportError:
            pass

    # ------------------------------------------------------------------ inputs and calls
    def make_inputs(self, seed: int) -> list[Any]:
        self.seed(seed)
        try:
            return self.generate()
        except BaseException as exc:  # noqa: BLE001
            self.fail(f"problem {self.job.problem_name}: get_inputs() raised "
                      f"{type(exc).__name__}: {exc}")
            raise _Stop from None

    def generate(self) -> list[Any]:
        # Created on the device directly (the evaluation device is the default one while
        # get_inputs runs): drawing GPU-sized inputs on the CPU takes seconds per trial.
        with torch.device(self.device):
            inputs = list(self.get_inputs())
        return [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs]

    @staticmethod
    def clone(inputs: list[Any]) -> list[Any]:
        return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def sync_or_stop(self) -> None:
        try:
            self.sync()
        except BaseException as exc:  # noqa: BLE001
            self.fail(f"device error: {type(exc).__name__}: {exc}")
            raise _Stop from None

    def call_candidate(self, inputs: list[Any], what: str, check_globals: bool = True) -> Any:
        launches, errors = self.ledger.launches, len(self.ledger.errors)
        threads = self.threads.started
        # Inputs (clones, poisoned blocks) complete before the call: a candidate whose work runs
        # on another stream must not be judged on a race with our own copies.
        self.sync_or_stop()
        began = time.perf_counter()
        try:
            out = self.cand(*inputs)
            self.sync()
        except BaseException as exc:  # noqa: BLE001
            self.launches += self.ledger.launches - launches
            self.fail(f"ModelNew raised on {what}: {type(exc).__name__}: {exc}")
            raise _Stop from None
        if "first_call" not in self.seconds:
            # The first call compiles Triton kernels (JIT): reported apart as compile time.
            self.seconds["first_call"] = time.perf_counter() - began
        self.launches += self.ledger.launches - launches
        if len(self.ledger.errors) > errors:
            self.flag(f"kernel-error-fallback: its kernel raised on {what} and the call still "
                      f"returned: {self.ledger.errors[errors]}")
        if self.threads.started > threads:
            self.flag(f"thread: started {self.threads.started - threads} thread(s) on {what}")
        if check_globals:
            probes.check_globals(self)
        return out

    def call_reference(self, inputs: list[Any]) -> Any:
        try:
            out = self.ref(*inputs)
            self.sync()
        except BaseException as exc:  # noqa: BLE001
            self.fail(f"problem {self.job.problem_name}: Model raised "
                      f"{type(exc).__name__}: {exc}")
            raise _Stop from None
        return out

    def poison(self) -> None:
        """Fill the allocator's free blocks of the output sizes with 0xFF bytes (NaN as float)."""
        # A guard (listed in specgen.eval.guards) kept as a step of the flow: on the CPU whether
        # these blocks are the ones the candidate's next allocation gets depends on the heap's
        # layout, and as a function in guards/probes.py the runner's candidate got fresh zeroed
        # memory instead (tests/eval/redteam/unwritten_output.py passed unseen).
        blocks = []
        for nbytes in self.out_nbytes:
            for _ in range(2):
                blocks.append(torch.full((max(nbytes, 1),), 255, dtype=torch.uint8,
                                         device=self.device))
        del blocks

    # ------------------------------------------------------------------ correctness
    def compare_outputs(self, out_c: Any, out_r: Any, what: str) -> bool:
        result = compare(out_c, out_r, self.options.atol, self.options.rtol)
        self.compared = True
        self.max_abs = max(self.max_abs, result.max_abs)
        self.max_rel = max(self.max_rel, result.max_rel)
        if result.ok:
            return True
        if result.subclass:
            self.flag(f"tensor-subclass: returned a {result.subclass} on {what}")
        elif result.precision_suspect:
            self.flag(f"precision: matches only at fp16/bf16 tolerance on {what} "
                      f"(max abs error {result.max_abs:.3g})")
        self.fail(f"{result.reason} ({what})")
        return False

    def _correctness_trials(self) -> None:
        probe = self.make_inputs(self.base_seed + 1000)
        ref_out = self.call_reference(self.clone(probe))
        self.out_nbytes = [t.numel() * t.element_size() for t in flatten(ref_out)
                           if isinstance(t, torch.Tensor)]
        self.shapes = _shapes(probe)
        del ref_out, probe
        previous: list[Any] = []
        for trial in range(self.options.trials):
            what = f"trial {trial}"
            inputs = self.make_inputs(self.base_seed + trial)
            if _shapes(inputs) != self.shapes:
                self.flag(f"problem-namespace: get_inputs() gave shapes {_shapes(inputs)} on "
                          f"{what}, {self.shapes} before")
            cand_in, ref_in, pristine = self.clone(inputs), self.clone(inputs), inputs
            self.poison()
            out_c = self.call_candidate(cand_in, what)
            out_r = self.call_reference(ref_in)
            if not self.compare_outputs(out_c, out_r, what):
                return
            probes.trial_guards(self, out_c, out_r, cand_in, ref_in, pristine, previous, what)
            previous = [t for t in flatten(out_c) if isinstance(t, torch.Tensor)]

    def _single_check(self, what: str) -> None:
        inputs = self.make_inputs(self.base_seed)
        self.poison()
        out_c = self.call_candidate(self.clone(inputs), what)
        out_r = self.call_reference(self.clone(inputs))
        self.compare_outputs(out_c, out_r, what)

    # ------------------------------------------------------------------ probes
    def _probes(self) -> None:
        if self.verdict.error is not None:
            return
        probes.memo_probe(self)
        # The second shape runs before parameters are randomized, so that a candidate failing
        # both is told about each for its own reason.
        if self.verdict.error is None and self.options.second_shape:
            probes.second_shape_trial(self)
        if self.verdict.error is None and self.options.randomized_params:
            probes.randomized_params_trial(self)
        if self.verdict.error is None:
            probes.kernels_ran(self)
        if self.verdict.error is None and self.cuda:
            with self._timed("profiler"):
                probes.profiler_probe(self)

    # ------------------------------------------------------------------ profiling
    def _profile(self) -> None:
        options = self.options
        sets = self._input_sets()
        cand_sets = [self.clone(s) for s in sets]
        ref_sets = [self.clone(s) for s in sets]
        timer = Timer(self.device, options.l2_flush_mb)
        threads, launches = self.threads.started, self.ledger.launches
        with self._timed("timing"):
            try:
                stats = timer.time(lambda ins: self.cand(*ins), cand_sets, options.warmup,
                                   options.timing_trials)
            except BaseException as exc:  # noqa: BLE001
                self.fail(f"ModelNew raised while being timed: {type(exc).__name__}: {exc}")
                self.verdict.correct = False
                return
        self.launches += self.ledger.launches - launches
        if timer.hidden_work_trials:
            self.notes.append(f"{timer.hidden_work_trials} timed calls kept the device busy past "
                              "their end event (work outside the current stream): counted by "
                              "the device-wide synchronize")
        if self.threads.started > threads:
            self.flag(f"thread: started {self.threads.started - threads} thread(s) while timed")
        probes.check_globals(self)
        self.verdict.candidate_ms = stats.median_ms
        self.verdict.spread = stats.spread
        if self.job.ref_timing is not None:
            ref = self.job.ref_timing
            self.verdict.ref_ms, self.verdict.ref_compiled_ms = ref.ref_ms, ref.ref_compiled_ms
            self.verdict.ref_cached = True
        else:
            with self._timed("ref_timing"):
                ref_stats = timer.time(lambda ins: self.ref(*ins), ref_sets, options.warmup,
                                       options.timing_trials)
                compiled_ms = self._time_compiled(timer, ref_sets)
            self.verdict.ref_ms, self.verdict.ref_compiled_ms = ref_stats.median_ms, compiled_ms
            self.new_ref_timing = RefTiming(ref_ms=ref_stats.median_ms, ref_spread=ref_stats.spread,
                                            ref_compiled_ms=compiled_ms, samples=ref_stats.samples)
        self.verdict.speedup = self.verdict.ref_ms / max(stats.median_ms, 1e-9)
        # The output after many calls must still be right (a candidate that changes behaviour
        # once it believes it is being timed is caught here).
        with self._timed("correctness"):
            out_c = self.call_candidate(cand_sets[0], "after timing")
            out_r = self.call_reference(self.clone(sets[0]))
            self.compare_outputs(out_c, out_r, "after timing")
        if self.cuda and options.floor_check:
            probes.floor_check(self, sets[0], stats.median_ms)
        if self.flags or self.verdict.error:
            self.verdict.correct = False

    def _input_sets(self) -> list[list[Any]]:
        first = self.make_inputs(self.base_seed + 6000)
        per_set = sum(x.numel() * x.element_size() for x in first if isinstance(x, torch.Tensor))
        if self.cuda:
            free, _ = torch.cuda.mem_get_info()
            budget = free // 4
        else:
            budget = 1 << 30
        # three copies of each set live at once: the set, and one clone per model
        count = max(1, min(self.options.input_sets, budget // max(3 * per_set, 1)))
        if count < self.options.input_sets:
            self.notes.append(f"timing rotates {count} input sets (memory), not "
                              f"{self.options.input_sets}")
        return [first] + [self.make_inputs(self.base_seed + 6000 + i) for i in range(1, count)]

    def _time_compiled(self, timer: Timer, ref_sets: list[list[Any]]) -> float | None:
        if not self.options.compile_baseline:
            return None
        try:
            compiled = torch.compile(self.ref)
            stats = timer.time(lambda ins: compiled(*ins), ref_sets, self.options.warmup,
                               self.options.timing_trials)
            return stats.median_ms
        except Exception as exc:  # noqa: BLE001 - the second baseline is optional
            self.notes.append(f"torch.compile baseline failed: {type(exc).__name__}: {exc}")
            return None


class _Clock:
    def __init__(self, seconds: dict[str, float], key: str) -> None:
        self.seconds, self.key = seconds, key

    def __enter__(self) -> None:
        self.began = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.seconds[self.key] = self.seconds.get(self.key, 0.0) + time.perf_counter() - self.began


# ---------------------------------------------------------------------- helpers
def _shapes(inputs: list[Any]) -> list[Any]:
    return [tuple(x.shape) if isinstance(x, torch.Tensor) else x for x in inputs]
