"""`EvalWorker`: evaluates candidates on one device; the judge of each verdict.

A worker owns a device ("cpu" or "cuda:N"), a work directory and a template process (imports done,
no CUDA context) from which it forks, inside the sandbox:

* one **reference runner** per problem it is evaluating (kept while candidates of that problem
  come; it holds the problem's reference and computes its accurate values);
* a **candidate runner** per candidate, started ahead of need (`spare_processes` of them kept
  ready), used for that one candidate and then killed with its whole tree;
* a **build runner** per candidate with `load_inline` extensions not yet in the cache.

`run()` parses the sources (nothing of them runs here), builds what needs building (eval/builds.py),
and lets the judge (eval/judge.py) make the verdict from the two runners. The reference's timing is
cached per problem source, device and timing settings; builds are cached per candidate source.
Nothing a candidate does can crash the worker or reach another candidate's run: a runner owns its
process and can send whatever it likes, so an exception raised anywhere while judging a candidate
ends as that candidate's verdict (code `candidate`), with its runners killed and the traceback in
the worker's log, and the worker takes the next candidate.
"""
from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Sequence, get_args

import msgspec

from specgen.errors import UsageError
from specgen.eval import runner_process, sandbox
from specgen.eval.builds import Builds
from specgen.eval.device_turns import DeviceTurns
from specgen.eval.inputs import new_init_seed
from specgen.eval.judge import Judge, ProblemState
from specgen.eval.loader import CandidateSource, ProblemSource, candidate_from_text, problem_from_text
from specgen.eval.redact import redact_verdict
from specgen.eval.runner_process import Runner, RunnerError, SparePool, Template
from specgen.eval.sandbox import SandboxStatus
from specgen.messages import (STAGES, BuildResult, CandidateSubmission, EvalOptions, LoadProblem,
                              ProblemLoaded, RefTiming, RunnerReady, SandboxMode, Verdict)

log = logging.getLogger(__name__)

SANDBOX_MODES = get_args(SandboxMode)
_ERROR_CHARS = 600              # of an unexpected exception's text in a verdict


class RefTimingCache:
    """Reference timings on disk, one small JSON file per key (atomic replace)."""

    def __init__(self, root: Path) -> None:
        self.root = root / "ref-timing"
        self.root.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def key(problem_sha: str, device: str, ready: RunnerReady, options: EvalOptions) -> str:
        material = "|".join((problem_sha, device, ready.device_name, ready.torch_version,
                             options.timing_key(), options.resolved_scale(
                                 "cuda" if device.startswith("cuda") else "cpu")))
        return hashlib.sha256(material.encode()).hexdigest()[:32]

    def get(self, key: str) -> RefTiming | None:
        path = self.root / f"{key}.json"
        try:
            return msgspec.json.decode(path.read_bytes(), type=RefTiming)
        except (OSError, msgspec.DecodeError, RecursionError):
            return None

    def put(self, key: str, timing: RefTiming) -> None:
        path = self.root / f"{key}.json"
        staging = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        staging.write_bytes(msgspec.json.encode(timing))
        os.replace(staging, path)


class _Reference:
    """The reference runner of one problem, kept between candidates."""

    def __init__(self, key: tuple[str, str], runner: Runner, state: ProblemState) -> None:
        self.key = key
        self.runner = runner
        self.state = state


class EvalWorker:
    """Evaluates one candidate at a time on one device; see the module doc."""

    def __init__(self, device: str = "cpu", work_dir: Path | str = ".specgen-eval",
                 spare_processes: int = 1, options: EvalOptions | None = None,
                 name: str | None = None, hidden_paths: Sequence[str | Path] = (),
                 gpu_sharers: int = 1) -> None:
        """`hidden_paths`: directories candidates must not see even where the sandbox's view
        would show them (the runtime adds its socket directories). `gpu_sharers`: how many
        workers share this worker's GPU, itself included; each gets that share of
        `gpu_memory_fraction`, so that a candidate hoarding device memory (a memo of every output
        it returned) runs out of its own share instead of failing its neighbours' honest
        candidates with out-of-memory errors."""
        if device != "cpu" and not (device.startswith("cuda:") and device[5:].isdigit()):
            raise UsageError(f"device must be 'cpu' or 'cuda:N', got {device!r}")
        if spare_processes < 0:
            raise UsageError(f"spare_processes must be >= 0, got {spare_processes}")
        if gpu_sharers < 1:
            raise UsageError(f"gpu_sharers must be >= 1, got {gpu_sharers}")
        self.device = device
        self.work_dir = Path(work_dir).resolve()
        self.spare_processes = spare_processes
        options = options or EvalOptions()
        if options.sandbox not in SANDBOX_MODES:
            raise UsageError(f"EvalOptions.sandbox must be one of {', '.join(SANDBOX_MODES)}, "
                             f"got {options.sandbox!r}")
        self.cache_dir = Path(options.cache_dir).resolve() if options.cache_dir \
            else self.work_dir / "cache"
        # Runners read the cache from the options (they get it with each request).
        self.options = msgspec.structs.replace(
            options, cache_dir=str(self.cache_dir),
            gpu_memory_fraction=options.gpu_memory_fraction / gpu_sharers)
        self.hidden_paths = [str(Path(p).resolve()) for p in hidden_paths]
        self.sandbox_status = SandboxStatus(sandbox.NONE, "not started")
        self.name = name or f"{os.uname().nodename}/{device}"
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._current: list[Runner] = []
        self._cancel_requested = False
        # Cancels that name a run which has not started yet: kept so that a cancel arriving in
        # the instant between a caller taking an item and run() starting is not lost.
        self._run_id: str | None = None
        self._early_cancels: set[str] = set()
        self._template: Template | None = None
        self._template_env: dict[str, str] = {}
        self._pool: SparePool | None = None
        self._reference: _Reference | None = None
        self._ready: RunnerReady | None = None
        self._ref_cache: RefTimingCache | None = None
        self._turns: DeviceTurns | None = None
        self._builds = Builds(self.cache_dir, self.options, self._fork)
        self.evaluated = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        for sub in ("logs", "probe"):
            (self.work_dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.work_dir, 0o700)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._ref_cache = RefTimingCache(self.cache_dir)
        self._turns = DeviceTurns(self.device)
        if self.options.sandbox != "off" and sandbox.outer_uid() is not None:
            # Runners are other users: they read the cache (libraries this worker published)
            # through a read-only view, so its top folder must let others in (a mkdtemp'd or
            # pytest folder is 0700). Everything below it is created readable already.
            mode = self.cache_dir.stat().st_mode & 0o7777
            if mode & 0o005 != 0o005:
                os.chmod(self.cache_dir, mode | 0o055)
        extra = {}
        arch = os.environ.get("TORCH_CUDA_ARCH_LIST") or query_capability(self.device)
        if arch:
            # Build runners see no GPU: they must be told which architecture to compile for.
            extra["TORCH_CUDA_ARCH_LIST"] = arch
        self._template_env = extra
        template = None
        if self.options.sandbox == "off":
            self.sandbox_status = SandboxStatus(sandbox.NONE,
                                                "switched off (EvalOptions.sandbox='off')")
        else:
            try:
                template = Template(self.device, self.work_dir, self.options, True,
                                    self.cache_dir, self.hidden_paths, extra)
                self.sandbox_status = runner_process.probe(template)
            except (RunnerError, sandbox.SandboxError, OSError) as exc:
                self.sandbox_status = SandboxStatus(sandbox.NONE,
                                                    f"namespaces could not be created: {exc}")
            if self.sandbox_status.kind == sandbox.NONE and template is not None:
                template.close()
                template = None
        if self.sandbox_status.kind == sandbox.NONE:
            log.warning("worker %s: candidates run WITHOUT a sandbox: %s%s", self.name,
                        self.sandbox_status.detail,
                        "; they are refused (EvalOptions.sandbox='required')"
                        if self.refuses_candidates else "")
        if self.refuses_candidates:
            return
        if template is None:
            # Unsandboxed runs share a Triton cache. A sandboxed run keeps it in its private
            # /tmp: a cache one candidate can write is a place to plant compiled code another
            # candidate would load.
            extra["TRITON_CACHE_DIR"] = str(self.cache_dir / "triton")
            try:
                template = Template(self.device, self.work_dir, self.options, False,
                                    self.cache_dir, self.hidden_paths, extra)
            except RunnerError as exc:
                raise UsageError(f"worker {self.name}: {exc}") from None
        self._template = template
        self._pool = SparePool(lambda: self._fork("candidate"), self.spare_processes,
                               self.options.spawn_timeout_s)
        self._pool.start()

    @property
    def sandboxed(self) -> bool:
        return self.sandbox_status.kind == sandbox.NAMESPACES

    @property
    def refuses_candidates(self) -> bool:
        """No sandbox here and the options do not allow running without one."""
        return not self.sandboxed and self.options.sandbox == "required"

    @property
    def ready_info(self) -> RunnerReady | None:
        """What the last candidate runner reported at start-up (device name, versions)."""
        return self._ready

    def close(self) -> None:
        """Kill every runner and the template; no process outlives this."""
        with self._lock:
            pool, self._pool = self._pool, None
            current = list(self._current)
            reference, self._reference = self._reference, None
            template, self._template = self._template, None
        for runner in current:
            runner.signal_kill()
        if pool is not None:
            pool.close()
        if reference is not None:
            reference.runner.kill()
        if template is not None:
            template.close()
        turns, self._turns = self._turns, None
        if turns is not None:
            turns.close()

    def __enter__(self) -> "EvalWorker":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fork(self, role: str) -> Runner:
        if self._template is None:
            raise RunnerError("the worker is closed")
        if not self._template.alive():
            # A template that died (killed from outside) is started again: the worker goes on.
            log.warning("worker %s: the template died; starting a new one", self.name)
            old = self._template
            self._template = Template(self.device, self.work_dir, self.options, self.sandboxed,
                                      self.cache_dir, self.hidden_paths, self._template_env)
            old.close()
        return self._template.fork(role)

    # ------------------------------------------------------------------ cancel
    def cancel(self, run_id: str | None = None) -> None:
        """Stop an evaluation (thread-safe); its verdict says "cancelled".

        Without `run_id`, stops whatever runs now. With it, stops the run started with that id,
        also when `run(..., run_id=...)` has not begun yet: callers that hand work to this worker
        from another thread pass ids so that no cancel falls between hand-over and start.
        """
        with self._lock:
            if run_id is not None and run_id != self._run_id:
                if len(self._early_cancels) > 10_000:   # ids of runs that never came: forget them
                    self._early_cancels.clear()
                self._early_cancels.add(run_id)
                return
            self._cancel_requested = True
            current = [r for r in self._current if r.role != "reference"]
        for runner in current:
            runner.signal_kill()

    def _cancelled(self) -> bool:
        return self._cancel_requested

    def _track(self, runner: Runner | None, add: bool = True) -> bool:
        """Record a runner working for this run; False when a cancel already came."""
        with self._lock:
            if runner is not None:
                if add:
                    self._current.append(runner)
                elif runner in self._current:
                    self._current.remove(runner)
            return not self._cancel_requested

    # ------------------------------------------------------------------ build
    def build(self, candidate: CandidateSource | CandidateSubmission | str) -> BuildResult:
        """Build the candidate's extensions into the shared cache (no-op when cached or none).

        Thread-safe and independent of `run()`, so builds of queued candidates can use CPU cores
        while this worker's device runs another candidate.
        """
        problem = None
        if isinstance(candidate, CandidateSubmission):
            # With its problem, the build also finds what ModelNew builds in __init__ and forward.
            try:
                problem = problem_from_text(candidate.problem_source,
                                            name=candidate.problem_name or None) \
                    if candidate.problem_source else None
            except UsageError:
                problem = None
            candidate = candidate_from_text(candidate.candidate_source)
        elif isinstance(candidate, str):
            candidate = candidate_from_text(candidate)
        return self._builds.build(candidate, problem=problem, scale=self._scale())

    def _scale(self) -> str:
        """The problem scale runs use here (builds find the calls made at that scale)."""
        return self.options.resolved_scale("cuda" if self.device.startswith("cuda") else "cpu")

    # ------------------------------------------------------------------ the reference
    def _reference_for(self, problem: ProblemSource) -> tuple[_Reference | None, str | None]:
        """The reference runner of `problem` (kept from the last candidate when it is the same
        problem), or why none could be had (the problem's fault, or the runner's)."""
        scale = self.options.resolved_scale("cuda" if self.device.startswith("cuda") else "cpu")
        key = (problem.sha256, scale)
        current = self._reference
        if current is not None and current.key == key and not current.runner.dead:
            return current, None
        if current is not None:
            current.runner.kill()
            current.runner.remove_log()
            self._reference = None
        try:
            runner = self._fork("reference")
            ready = runner.wait_ready(self.options.spawn_timeout_s)
        except RunnerError as exc:
            return None, f"no reference runner: {exc}"
        request = LoadProblem(problem_source=problem.text, problem_name=problem.name,
                              scale=scale, init_seed=new_init_seed())
        self._track(runner)
        try:
            with self._turns.shared() if self._turns else contextlib.nullcontext():
                turns = self._turns

                def polled() -> bool:
                    if turns is not None:         # a timing of another worker goes first
                        turns.give_way(runner.pause, runner.resume)
                    return self._cancelled()
                received, why = runner.request(request, time.monotonic() + self.options.timeout_s,
                                               "EvalOptions.timeout_s", polled)
        finally:
            self._track(runner, add=False)
        if received is None or not isinstance(received.message, ProblemLoaded):
            runner.kill()
            return None, "cancelled" if why == "cancelled" else f"the reference runner failed: {why}"
        loaded = received.message
        if loaded.error:
            runner.kill()
            runner.remove_log()
            return None, loaded.error
        self._reference = _Reference(key, runner, ProblemState(problem, request, loaded, ready))
        return self._reference, None

    # ------------------------------------------------------------------ run
    def run(self, submission: CandidateSubmission, stage: str = "full",
            run_id: str | None = None) -> Verdict:
        """Evaluate one candidate; never raises for anything the candidate (or problem) does.

        `run_id` names this run for `cancel(run_id)`; a cancel for it that came first applies.
        """
        began = time.monotonic()
        if stage not in STAGES:
            raise UsageError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
        if self._pool is None and not self.refuses_candidates:
            raise RuntimeError("EvalWorker.start() was not called (or close() was)")
        with self._lock:
            self._run_id = run_id
            self._cancel_requested = run_id is not None and run_id in self._early_cancels
            self._early_cancels.discard(run_id)   # type: ignore[arg-type]
        try:
            verdict = self._run(submission, stage)
            redact_verdict(verdict)
        except Exception as exc:  # noqa: BLE001 - whatever a runner sent: this candidate's verdict
            verdict = self._failed(submission, exc)
        finally:
            with self._lock:
                self._run_id = None
        verdict.sandbox = self.sandbox_status.kind
        verdict.stage = stage
        verdict.device = self.device
        verdict.stage_seconds["total"] = round(time.monotonic() - began, 4)
        self.evaluated += 1
        return verdict

    def _failed(self, submission: CandidateSubmission, exc: Exception) -> Verdict:
        """The verdict of a run during which judging raised `exc`: every runner of the run is
        killed, the reference's too (a request to it may be unanswered, so it is out of step),
        and the worker is ready for the next candidate."""
        log.error("worker %s: judging candidate %s/%s raised; its runners are killed and the "
                  "candidate fails", self.name, submission.job_id, submission.candidate_id,
                  exc_info=exc)
        with self._lock:
            current, self._current = self._current, []
            reference, self._reference = self._reference, None
            cancelled = self._cancel_requested
        for runner in current + ([reference.runner] if reference is not None else []):
            try:
                runner.kill()
                runner.remove_log()
            except Exception:  # noqa: BLE001 - killing is best effort here, and never raises
                log.exception("worker %s: killing a runner failed", self.name)
        if cancelled:
            return Verdict(error="cancelled", code="cancelled",
                           cpu_timing=not self.device.startswith("cuda"))
        text = f"{type(exc).__name__}: {exc}"
        verdict = Verdict(error=f"the judge could not handle what the candidate's run sent, and "
                                f"stopped it: {text[:_ERROR_CHARS]}", code="candidate",
                          cpu_timing=not self.device.startswith("cuda"))
        try:
            redact_verdict(verdict)
        except Exception:  # noqa: BLE001
            verdict.error = f"the judge could not handle what the candidate's run sent, and " \
                            f"stopped it: {type(exc).__name__}"
        return verdict

    def _run(self, submission: CandidateSubmission, stage: str) -> Verdict:
        seconds: dict[str, float] = {}
        cpu_timing = not self.device.startswith("cuda")
        try:
            problem = problem_from_text(submission.problem_source, name=submission.problem_name
                                        or None)
        except UsageError as exc:
            return Verdict(error=f"problem source: {exc}", code="problem", cpu_timing=cpu_timing)
        try:
            candidate = candidate_from_text(submission.candidate_source, problem=problem)
        except UsageError as exc:
            return Verdict(error=f"candidate source: {exc}", code="candidate_source",
                           cpu_timing=cpu_timing)
        if self.refuses_candidates:
            return Verdict(error=(f"refused: this host cannot sandbox candidates "
                                  f"({self.sandbox_status.detail}); set EvalOptions.sandbox="
                                  f"'optional' (specgen-node --allow-unsandboxed) to run them "
                                  f"anyway"), code="refused", cpu_timing=cpu_timing)
        build = self._builds.build(candidate, self._cancelled, self._track, problem=problem,
                                   scale=self._scale())
        if candidate.needs_build:
            seconds["build"] = round(build.seconds, 4)
        if self._cancelled():
            return Verdict(error="cancelled", code="cancelled", cpu_timing=cpu_timing,
                           stage_seconds=seconds)
        if build.unfinished:
            return Verdict(error=f"extension {build.module_error}", code="build",
                           cpu_timing=cpu_timing, stage_seconds=seconds)
        assert self._pool is not None and self._ref_cache is not None
        started = time.monotonic()
        reference, why = self._reference_for(problem)
        seconds["reference_start"] = round(time.monotonic() - started, 4)
        if reference is None:
            cancelled = why == "cancelled"
            return Verdict(error="cancelled" if cancelled else f"{why} (the problem, not the candidate)",
                           code="cancelled" if cancelled else "reference", cpu_timing=cpu_timing,
                           stage_seconds=seconds)
        try:
            runner, waited = self._pool.take(self.options.spawn_timeout_s)
        except RunnerError as exc:
            return Verdict(error=f"no runner: {exc}", code="no_runner", cpu_timing=cpu_timing,
                           stage_seconds=seconds)
        seconds["spare_wait"] = round(waited, 4)
        self._ready = runner.ready
        if runner.startup_s is not None:
            # how long this runner took from its fork to ready, waited for or not, timed on this
            # side (the simulator models the waits at load from these)
            seconds["runner_startup"] = round(runner.startup_s, 4)
        ref_key = None
        ref_timing = None
        if stage != "validate" and self.options.cache_ref_timing:
            ref_key = RefTimingCache.key(problem.sha256, self.device, reference.state.ready,
                                         self.options)
            ref_timing = self._ref_cache.get(ref_key)
        if not self._track(runner):
            runner.kill()
            runner.remove_log()
            return Verdict(error="cancelled", code="cancelled", cpu_timing=cpu_timing,
                           stage_seconds=seconds)
        self._track(reference.runner)
        judge = Judge(self.options, self.device, reference.runner, runner, reference.state,
                      candidate, ref_timing, build, self._cancelled, self._turns)
        try:
            verdict = judge.run(stage)
        except RunnerError as exc:
            # A runner that went away under a request sent to it: killed by a cancel, or dead of
            # what the candidate (or, for the reference's, the problem) did.
            cancelled = self._cancel_requested
            verdict = Verdict(error="cancelled" if cancelled else str(exc),
                              code="cancelled" if cancelled else ("reference" if reference.runner.dead else ""),
                              cpu_timing=cpu_timing)
        finally:
            self._track(runner, add=False)
            self._track(reference.runner, add=False)
            runner.kill()
            runner.remove_log()
            if reference.runner.dead:
                reference.runner.kill()
                self._reference = None
        if judge.new_ref_timing is not None and ref_key is not None:
            self._ref_cache.put(ref_key, judge.new_ref_timing)
        if verdict.error and build.records and not any(r.ok for r in build.records) and \
                build.records[0].error and build.records[0].error not in verdict.error:
            verdict.error += f"; extension build: {build.records[0].error}"
        verdict.stage_seconds = {**seconds, **verdict.stage_seconds}
        return verdict


def query_capability(device: str) -> str:
    """Compute capability of a CUDA device ("9.0") from nvidia-smi, without importing torch."""
    if not device.startswith("cuda"):
        return ""
    index = device.split(":", 1)[1] if ":" in device else "0"
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and index.isdigit() and int(index) < len(visible):
        index = visible[int(index)]
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader",
                               "-i", index], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    value = done.stdout.strip().splitlines()[0].strip() if done.stdout.strip() else ""
    return value if done.returncode == 0 and value.replace(".", "").isdigit() else ""
