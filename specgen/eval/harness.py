"""One candidate's evaluation, inside a runner subprocess: load, check, probe, time.

The order matters and is part of the guards:
* the problem's module is executed first, in its own namespace; then the instrumentation (load_inline
  interception, launch and thread counters, identity snapshots of trusted functions); then the
  candidate's module, in a namespace of its own;
* both models are built from the same fresh seed; every trial draws fresh inputs from a fresh
  seed and gives each model its own clone; the candidate runs first, on an allocator whose free
  blocks were filled with NaN, so an output it never writes shows, and so it cannot find the
  reference's output of the same trial in memory;
* then the probes: inputs refreshed in place (memoization by pointer), randomized parameters
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
from specgen.eval.floor import floor_ms
from specgen.eval.instrument import (LaunchCounter, Sentinels, ThreadCounter, precision_state,
                                     restore_precision)
from specgen.eval.loader import candidate_from_text, exec_source, problem_from_text
from specgen.eval.protocol import RefTiming, RunJob, RunResult
from specgen.eval.static_guards import scan_source
from specgen.eval.timing import Timer
from specgen.messages import Verdict


class _Stop(Exception):
    """Evaluation cannot go on (the verdict already says why)."""


def run_job(job: RunJob, device: str, device_name: str) -> RunResult:
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
            self._check_globals()
            self.verdict.correct = not self.flags and self.verdict.error is None
        if stage == "profile":
            with self._timed("correctness"):
                self._single_check("re-check before timing")
            self._check_globals()
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
            self._seed(self.base_seed - 1)
            self.init_inputs = list(self.problem.get_init_inputs())
        except BaseException as exc:  # noqa: BLE001
            self.fail(f"problem {job.problem_name} failed to load: {type(exc).__name__}: {exc}")
            raise _Stop from None

    def _make_reference(self) -> None:
        try:
            self._seed(self.base_seed)
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
        self._check_globals()
        seed = self.base_seed
        self._make_reference()
        try:
            self._seed(seed)
            self.cand = model_new(*self.init_inputs)
            if isinstance(self.cand, torch.nn.Module):
                self.cand = self.cand.to(self.device)
        except BaseException as exc:  # noqa: BLE001
            self.fail(f"ModelNew(*get_init_inputs()) raised {type(exc).__name__}: {exc}"
                      + self._build_errors())
            self._sync_or_stop()
            raise _Stop from None
        self._check_globals()
        self.verdict.compiled = True

    def _build_errors(self) -> str:
        failed = [b for b in self.ledger.builds if not b.ok]
        return "".join(f"; extension {b.name} failed to build: {b.error}" for b in failed)

    def _seed(self, seed: int) -> None:
        random.seed(seed)
        torch.manual_seed(seed)
        try:
            import numpy as np
            np.random.seed(seed % (2**32))
        except ImportError:
            pass

    # ------------------------------------------------------------------ inputs and calls
    def make_inputs(self, seed: int) -> list[Any]:
        self._seed(seed)
        try:
            return self._generate()
        except BaseException as exc:  # noqa: BLE001
            self.fail(f"problem {self.job.problem_name}: get_inputs() raised "
                      f"{type(exc).__name__}: {exc}")
            raise _Stop from None

    def _generate(self) -> list[Any]:
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

    def _sync_or_stop(self) -> None:
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
        self._sync_or_stop()
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
            self._check_globals()
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

    def _check_globals(self) -> None:
        changed = self.sentinels.check()
        if changed:
            problem = [c for c in changed if c.startswith("problem")]
            timers = [c for c in changed if any(w in c for w in (
                "time.", "Event", "synchronize", "elapsed_time", "perf_counter", "do_bench"))]
            if problem:
                self.flag(f"problem-namespace: changed {', '.join(problem[:5])}")
            if timers:
                self.flag(f"timer-patch: replaced {', '.join(timers[:5])}")
            rest = [c for c in changed if c not in problem and c not in timers]
            if rest:
                self.flag(f"monkey-patch: replaced {', '.join(rest[:5])}")
        now = precision_state()
        diff = [k for k, v in now.items() if self.precision0.get(k) != v]
        if diff:
            self.flag(f"precision: changed {', '.join(diff)}")
            restore_precision(self.precision0)

    def poison(self) -> None:
        """Fill the allocator's free blocks of the output sizes with 0xFF bytes (NaN as float)."""
        blocks = []
        for nbytes in self.out_nbytes:
            for _ in range(2):
                blocks.append(torch.full((max(nbytes, 1),), 255, dtype=torch.uint8,
                                         device=self.device))
        del blocks

    # ------------------------------------------------------------------ correctness
    def _compare(self, out_c: Any, out_r: Any, what: str) -> bool:
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
            if not self._compare(out_c, out_r, what):
                return
            self._trial_guards(out_c, out_r, cand_in, ref_in, pristine, previous, what)
            previous = [t for t in flatten(out_c) if isinstance(t, torch.Tensor)]

    def _trial_guards(self, out_c: Any, out_r: Any, cand_in: list[Any], ref_in: list[Any],
                      pristine: list[Any], previous: list[Any], what: str) -> None:
        cand_outs = [t for t in flatten(out_c) if isinstance(t, torch.Tensor)]
        ref_outs = [t for t in flatten(out_r) if isinstance(t, torch.Tensor)]
        cand_inputs = [x for x in cand_in if isinstance(x, torch.Tensor)]
        ref_inputs = [x for x in ref_in if isinstance(x, torch.Tensor)]
        ref_mutates = any(not _same(a, b) for a, b in zip(ref_in, pristine))
        if not ref_mutates and any(not _same(a, b) for a, b in zip(cand_in, pristine)):
            self.flag(f"mutated-inputs: the candidate changed its input tensors on {what}")
        ref_aliases = any(_overlap(o, x) for o in ref_outs for x in ref_inputs)
        if not ref_aliases and any(_overlap(o, x) for o in cand_outs for x in cand_inputs):
            self.flag(f"output-aliases-input: the output shares memory with an input on {what}")
        persistent = _module_tensors(self.cand)
        if any(_overlap(o, p) for o in cand_outs for p in persistent):
            self.flag(f"output-aliases-persistent: the output shares memory with a tensor "
                      f"the module keeps, on {what}")
        if any(_overlap(o, r) for o in cand_outs for r in ref_outs):
            self.flag(f"reads-reference-output: the output is the reference's output on {what}")
        if any(_overlap(o, p) for o in cand_outs for p in previous):
            self.flag(f"same-output-buffer: {what} returned the storage of the previous call's "
                      "output, which was still alive")

    def _single_check(self, what: str) -> None:
        inputs = self.make_inputs(self.base_seed)
        self.poison()
        out_c = self.call_candidate(self.clone(inputs), what)
        out_r = self.call_reference(self.clone(inputs))
        self._compare(out_c, out_r, what)

    # ------------------------------------------------------------------ probes
    def _probes(self) -> None:
        if self.verdict.error is not None:
            return
        self._memo_probe()
        # The second shape runs before parameters are randomized, so that a candidate failing
        # both is told about each for its own reason.
        if self.verdict.error is None and self.options.second_shape:
            self._second_shape_trial()
        if self.verdict.error is None and self.options.randomized_params:
            self._randomized_params_trial()
        if self.verdict.error is None:
            self._kernels_ran()
        if self.verdict.error is None and self.cuda:
            with self._timed("profiler"):
                self._profiler_probe()

    def _memo_probe(self) -> None:
        """Same input buffers, new values: a result cached by pointer or shape comes back stale."""
        what = "inputs refreshed in place"
        inputs = self.clone(self.make_inputs(self.base_seed + 2000))
        if not any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in inputs):
            self.notes.append("memoization probe skipped: no floating-point inputs")
            return
        first = [t.clone() for t in flatten(self.call_candidate(inputs, what))
                 if isinstance(t, torch.Tensor)]
        fresh = self.make_inputs(self.base_seed + 2001)
        for held, new in zip(inputs, fresh):
            if isinstance(held, torch.Tensor):
                held.copy_(new)
        out_c = self.call_candidate(inputs, what)
        out_r = self.call_reference(self.clone(fresh))
        result = compare(out_c, out_r, self.options.atol, self.options.rtol)
        if result.ok:
            return
        second = [t for t in flatten(out_c) if isinstance(t, torch.Tensor)]
        if len(second) == len(first) and all(
                a.shape == b.shape and torch.equal(a, b) for a, b in zip(first, second)):
            self.flag("memoized: the output did not change when the input values changed in "
                      "place (a result cached by data pointer, shape or call)")
        else:
            self._compare(out_c, out_r, what)

    def _randomized_params_trial(self) -> None:
        if not isinstance(self.cand, torch.nn.Module):
            self.notes.append("randomized-parameter trial skipped: ModelNew is not an nn.Module")
            return
        ref_params = list(self.ref.named_parameters())
        cand_params = list(self.cand.named_parameters())
        if not ref_params and not cand_params:
            return
        pairs = _match_parameters(ref_params, cand_params)
        if pairs is None:
            self.flag("parameter-mismatch: Model has " + _describe_params(ref_params) +
                      "; ModelNew has " + _describe_params(cand_params))
            return
        generator = torch.Generator(device="cpu").manual_seed(self.base_seed + 3000)
        for ref_p, cand_p in pairs:
            noise = torch.randn(ref_p.shape, generator=generator, dtype=torch.float32)
            factor = 0.5 + torch.rand(ref_p.shape, generator=generator, dtype=torch.float32)
            spread = float(ref_p.detach().float().std()) if ref_p.numel() > 1 else 0.0
            spread = spread if spread > 0 else 1.0
            new = (ref_p.detach().float().cpu() * factor + 0.1 * spread * noise)
            ref_p.data.copy_(new.to(ref_p.dtype).to(ref_p.device))
            cand_p.data.copy_(new.to(cand_p.dtype).reshape(cand_p.shape).to(cand_p.device))
        what = "randomized parameters"
        inputs = self.make_inputs(self.base_seed + 3001)
        out_c = self.call_candidate(self.clone(inputs), what)
        out_r = self.call_reference(self.clone(inputs))
        result = compare(out_c, out_r, self.options.atol, self.options.rtol)
        if not result.ok:
            self.flag(f"initial-params-only: with random parameter values loaded into both "
                      f"models the outputs differ ({result.reason})")

    def _second_shape_trial(self) -> None:
        names = _shape_constants(self.problem)
        if not names:
            self.notes.append("second shape skipped: no module constant is read only by "
                              "get_inputs()")
            return
        saved = {name: getattr(self.problem, name) for name in names}
        changed = {name: _other_size(value) for name, value in saved.items()}
        what = "second shape " + ", ".join(f"{k}={v}" for k, v in changed.items())
        try:
            for name, value in changed.items():
                setattr(self.problem, name, value)
            try:
                self._seed(self.base_seed + 4000)
                inputs = self._generate()
                out_r = self.ref(*self.clone(inputs))
                self.sync()
            except BaseException as exc:  # noqa: BLE001
                self.notes.append(f"second shape skipped: the reference rejects {what} "
                                  f"({type(exc).__name__})")
                self._sync_or_stop()
                return
            launches, errors = self.ledger.launches, len(self.ledger.errors)
            try:
                out_c = self.cand(*self.clone(inputs))
                self.sync()
            except BaseException as exc:  # noqa: BLE001
                self.launches += self.ledger.launches - launches
                self._sync_or_stop()
                self.flag(f"hard-coded-shape: ModelNew raised on {what}: "
                          f"{type(exc).__name__}: {str(exc)[:300]}")
                return
            self.launches += self.ledger.launches - launches
            if len(self.ledger.errors) > errors:
                self.flag(f"kernel-error-fallback: its kernel raised on {what} and the call still "
                          f"returned: {self.ledger.errors[errors]}")
            result = compare(out_c, out_r, self.options.atol, self.options.rtol)
            if not result.ok:
                self.flag(f"hard-coded-shape: wrong on {what}: {result.reason}")
        finally:
            for name, value in saved.items():
                setattr(self.problem, name, value)

    def _kernels_ran(self) -> None:
        failed = [b for b in self.ledger.builds if not b.ok]
        if failed:
            self.flag(f"custom-kernel-not-run: extension {failed[0].name} failed to build "
                      f"({(failed[0].error or '')[:300]}) and the candidate ran without it")
        elif self.candidate.claims_custom_kernels and self.launches == 0:
            kinds = " and ".join(self.candidate.kernel_kinds)
            self.flag(f"custom-kernel-not-run: the candidate defines {kinds} kernels but none "
                      "of them ran")

    def _profiler_probe(self) -> None:
        """Which kernels, on which streams: compared with what the reference launches."""
        from torch.profiler import ProfilerActivity, profile

        inputs = self.make_inputs(self.base_seed + 5000)

        def kernels(call: Callable[[], Any]) -> list[tuple[str, int]]:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                call()
                torch.cuda.synchronize()
            found = []
            for event in prof.profiler.kineto_results.events():
                if str(event.device_type()).endswith("CUDA"):
                    found.append((event.name(), int(event.device_resource_id())))
            return found

        ref_in, cand_in = self.clone(inputs), self.clone(inputs)  # copies outside the window
        self.sync()
        try:
            ref_k = kernels(lambda: self.call_reference(ref_in))
            cand_k = kernels(lambda: self.call_candidate(cand_in, "profiled call"))
        except _Stop:
            raise
        except Exception as exc:  # noqa: BLE001 - the profiler is optional evidence
            self.notes.append(f"profiler probe skipped: {type(exc).__name__}: {exc}")
            return
        ref_streams = {s for _, s in ref_k}
        extra = sorted({s for _, s in cand_k} - ref_streams)
        if ref_streams and extra:
            names = sorted({n for n, s in cand_k if s in extra})[:3]
            self.flag(f"side-stream: kernels ran on stream(s) {extra}, the current stream is "
                      f"{sorted(ref_streams)} ({', '.join(names)})")
        cand_names, ref_names = {n for n, _ in cand_k}, {n for n, _ in ref_k}
        if self.candidate.claims_custom_kernels and cand_names and cand_names <= ref_names:
            self.flag("custom-kernel-not-run: it launched only kernels the reference launches ("
                      + ", ".join(sorted(cand_names)[:3]) + ")")
        self.candidate_kernels = sorted(cand_names)

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
        self._check_globals()
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
            self._compare(out_c, out_r, "after timing")
        if self.cuda and options.floor_check:
            self._floor_check(sets[0], stats.median_ms)
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

    def _floor_check(self, inputs: list[Any], candidate_ms: float) -> None:
        bytes_read = sum(x.numel() * x.element_size() for x in inputs
                         if isinstance(x, torch.Tensor))
        bytes_read += sum(p.numel() * p.element_size() for p in self.ref.parameters())
        flops = None
        get_flops = getattr(self.problem, "get_flops", None)
        if callable(get_flops):
            try:
                flops = int(get_flops())
            except Exception:  # noqa: BLE001
                flops = None
        half = any(isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16)
                   for x in inputs)
        floor = floor_ms(bytes_read, flops, self.device_name, half,
                         self.options.peak_bandwidth_gbs, self.options.peak_tflops)
        if floor is None:
            self.notes.append(f"floor check skipped: no peak figures for {self.device_name}")
            return
        self.verdict.floor_ms = floor
        if candidate_ms < floor:
            self.flag(f"beyond-floor: {candidate_ms:.4f} ms is below the physical floor "
                      f"{floor:.4f} ms ({bytes_read} bytes"
                      + (f", {flops} flops" if flops else "") + f" on {self.device_name})")


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


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and bool(torch.equal(a, b))
    return True


def _span(t: torch.Tensor) -> tuple[int, int] | None:
    if t.numel() == 0:
        return None
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return (start, start + storage.nbytes()) if storage.nbytes() else None


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device:
        return False
    sa, sb = _span(a), _span(b)
    return sa is not None and sb is not None and sa[0] < sb[1] and sb[0] < sa[1]


def _module_tensors(module: Any) -> list[torch.Tensor]:
    """Tensors a module keeps between calls: parameters, buffers and plain tensor attributes."""
    if not isinstance(module, torch.nn.Module):
        return []
    found = list(module.parameters()) + list(module.buffers())
    for sub in module.modules():
        for value in vars(sub).values():
            if isinstance(value, torch.Tensor):
                found.append(value)
            elif isinstance(value, (list, tuple)):
                found += [v for v in value if isinstance(v, torch.Tensor)]
            elif isinstance(value, dict):
                found += [v for v in value.values() if isinstance(v, torch.Tensor)]
    return found


def _match_parameters(ref: list[tuple[str, torch.Tensor]], cand: list[tuple[str, torch.Tensor]]
                      ) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Pairs of (reference, candidate) parameters, by name, else by order; same number of
    elements required (a flattened copy of a parameter lines up, a differently sized one not)."""
    if len(ref) != len(cand):
        return None
    ref_by_name, cand_by_name = dict(ref), dict(cand)
    if set(ref_by_name) == set(cand_by_name) and all(
            ref_by_name[n].numel() == cand_by_name[n].numel() for n in ref_by_name):
        return [(ref_by_name[n], cand_by_name[n]) for n in ref_by_name]
    if all(r.numel() == c.numel() for (_, r), (_, c) in zip(ref, cand)):
        return [(r, c) for (_, r), (_, c) in zip(ref, cand)]
    return None


def _describe_params(params: list[tuple[str, torch.Tensor]]) -> str:
    if not params:
        return "no parameters"
    shown = ", ".join(f"{name}{tuple(p.shape)}" for name, p in params[:6])
    return shown + (f" and {len(params) - 6} more" if len(params) > 6 else "")


def _shape_constants(problem: Any) -> list[str]:
    """Module-level ints read by get_inputs() but not by get_init_inputs() or Model."""
    def names_read(fn: Any) -> set[str]:
        code = getattr(fn, "__code__", None)
        found: set[str] = set()
        stack = [code] if code is not None else []
        while stack:
            c = stack.pop()
            found |= set(c.co_names)
            stack += [k for k in c.co_consts if hasattr(k, "co_names")]
        return found

    by_inputs = names_read(problem.get_inputs)
    by_init = names_read(problem.get_init_inputs)
    model = problem.Model
    for value in vars(model).values():
        by_init |= names_read(value)
    return sorted(n for n in by_inputs - by_init
                  if isinstance(getattr(problem, n, None), int)
                  and not isinstance(getattr(problem, n), bool))


def _other_size(value: int) -> int:
    """A different size of the same kind: 3/4 of it (kept even), or one more when small."""
    if value < 4:
        return value + 1
    other = (value * 3) // 4
    if value % 2 == 0 and other % 2:
        other += 1
    return other if other != value else value + 2
