"""`EvalWorker`: evaluates candidates on one device, each in a fresh runner subprocess.

A worker owns a device ("cpu" or "cuda:N"), a work directory, and a pool of spare runners that
already imported torch and hold a CUDA context. `run()` checks the sources statically, builds
`load_inline` extensions in a separate CPU-side build process (skipped when the shared cache has
them), hands the job to a spare runner, watches it (deadline, memory, cancel) and returns its
verdict; a runner that crashes, hangs or blows its memory costs that candidate only. The
reference's timing is cached per problem source, device and timing settings, so it is measured
once per problem, not once per candidate.
"""
from __future__ import annotations

import hashlib
import itertools
import logging
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Sequence

import msgspec

from specgen.errors import UsageError
from specgen.eval import sandbox
from specgen.eval.extensions import publish_builds
from specgen.eval.guards.static import scan_source
from specgen.eval.loader import CandidateSource, candidate_from_text, problem_from_text
from specgen.eval.redact import redact_verdict
from specgen.eval.runner_process import RunnerError, RunnerProcess, SparePool, runner_env
from specgen.eval.sandbox import SandboxSpec, SandboxStatus
from specgen.messages import (BuildJob, BuildResult, CandidateSubmission, EvalOptions, RefTiming, RunJob,
                              RunnerReady, RunResult, Verdict)

log = logging.getLogger(__name__)

STAGES = ("validate", "profile", "full")
SANDBOX_MODES = ("required", "optional", "off")
_BUILD_MEMORY_MB = None  # builds are the compiler's: only the wall clock limits them


class _Inflight:
    """Builds in progress in this process, by cache directory and candidate source hash: a
    worker that needs a build another thread is running waits for it instead of compiling twice."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[tuple[str, str], threading.Event] = {}

    def claim(self, key: tuple[str, str]) -> threading.Event | None:
        """None: the caller builds (and must `release`); else an event to wait on."""
        with self._lock:
            if key in self._events:
                return self._events[key]
            self._events[key] = threading.Event()
            return None

    def release(self, key: tuple[str, str]) -> None:
        with self._lock:
            event = self._events.pop(key, None)
        if event is not None:
            event.set()


_INFLIGHT = _Inflight()


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


class EvalWorker:
    """Evaluates one candidate at a time on one device; see the module docstring."""

    def __init__(self, device: str = "cpu", work_dir: Path | str = ".specgen-eval",
                 spare_processes: int = 1, options: EvalOptions | None = None,
                 name: str | None = None, hidden_paths: Sequence[str | Path] = ()) -> None:
        """`hidden_paths`: directories candidates must not see beyond the defaults (the
        cluster's state, key and socket directories); the work directory is always hidden."""
        if device != "cpu" and not (device.startswith("cuda:") and device[5:].isdigit()):
            raise UsageError(f"device must be 'cpu' or 'cuda:N', got {device!r}")
        if spare_processes < 0:
            raise UsageError(f"spare_processes must be >= 0, got {spare_processes}")
        self.device = device
        self.work_dir = Path(work_dir).resolve()
        self.spare_processes = spare_processes
        self.options = options or EvalOptions()
        if self.options.sandbox not in SANDBOX_MODES:
            raise UsageError(f"EvalOptions.sandbox must be one of {', '.join(SANDBOX_MODES)}, "
                             f"got {self.options.sandbox!r}")
        self.hidden_paths = [str(Path(p).resolve()) for p in hidden_paths]
        self.sandbox_status = SandboxStatus(sandbox.NONE, "not started")
        self.name = name or f"{os.uname().nodename}/{device}"
        self.cache_dir = Path(self.options.cache_dir).resolve() if self.options.cache_dir \
            else self.work_dir / "cache"
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._current: RunnerProcess | None = None
        self._cancel_requested = False
        # Cancels that name a run which has not started yet: kept so that a cancel arriving in
        # the instant between a caller taking an item and run() starting is not lost.
        self._run_id: str | None = None
        self._early_cancels: set[str] = set()
        self._pool: SparePool | None = None
        self._ready: RunnerReady | None = None
        self._ref_cache: RefTimingCache | None = None
        self._queried_capability: str | None = None
        self.evaluated = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        for sub in ("jobs", "logs", "build", "runs"):
            (self.work_dir / sub).mkdir(parents=True, exist_ok=True)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._ref_cache = RefTimingCache(self.cache_dir)
        if self.options.sandbox == "off":
            self.sandbox_status = SandboxStatus(sandbox.NONE, "switched off (EvalOptions.sandbox='off')")
        elif self.device.startswith("cuda"):
            # Namespaces alone are not enough on a GPU host: the driver must start inside them.
            visible = runner_env(self.device, {}, False)["CUDA_VISIBLE_DEVICES"]
            self.sandbox_status = sandbox.probe_cuda(visible)
        else:
            self.sandbox_status = sandbox.probe()
        if self.sandboxed and sandbox.outer_uid() is not None:
            # Runners are another user: they read the cache (libraries this worker published)
            # through a read-only view, so its top folder must let others in (a mkdtemp'd or
            # pytest folder is 0700). Everything below it is created readable already.
            mode = self.cache_dir.stat().st_mode & 0o7777
            if mode & 0o005 != 0o005:
                os.chmod(self.cache_dir, mode | 0o055)
        if self.sandbox_status.kind == sandbox.NONE:
            refusing = self.refuses_candidates
            log.warning("worker %s: candidates run WITHOUT a sandbox: %s%s", self.name,
                        self.sandbox_status.detail,
                        "; they are refused (EvalOptions.sandbox='required')" if refusing else "")
        self._pool = SparePool(self._new_runner,
                               0 if self.refuses_candidates else self.spare_processes)
        self._pool.start()

    @property
    def sandboxed(self) -> bool:
        return self.sandbox_status.kind == sandbox.NAMESPACES

    @property
    def refuses_candidates(self) -> bool:
        """No sandbox here and the options do not allow running without one."""
        return not self.sandboxed and self.options.sandbox == "required"

    def close(self) -> None:
        """Kill the spares and any running runner; no process outlives this."""
        with self._lock:
            pool, self._pool = self._pool, None
            current = self._current
        if current is not None:
            current.signal_kill()
        if pool is not None:
            pool.close()

    def __enter__(self) -> "EvalWorker":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _env(self, device: str) -> dict[str, str]:
        extra = {}
        if not self.sandboxed:
            # Unsandboxed runs share a Triton cache and a build folder. A sandboxed run keeps
            # both in its private /tmp (runner_env): a cache one candidate can write is a place
            # to plant compiled code another candidate would load.
            extra = {"TORCH_EXTENSIONS_DIR": str(self.work_dir / "build" / "torch_extensions"),
                     "TRITON_CACHE_DIR": str(self.cache_dir / "triton")}
        arch = os.environ.get("TORCH_CUDA_ARCH_LIST") or self._capability()
        if arch:
            # Build processes see no GPU: they must be told which architecture to compile for.
            extra["TORCH_CUDA_ARCH_LIST"] = arch
        return runner_env(device, extra, self.sandboxed)

    def _capability(self) -> str:
        if not self.device.startswith("cuda"):
            return ""
        if self._ready is not None and self._ready.capability:
            return self._ready.capability
        if self._queried_capability is None:
            self._queried_capability = query_capability(self.device)
        return self._queried_capability

    def _new_runner(self, mode: str = "run", build_dir: Path | None = None) -> RunnerProcess:
        device = self.device if mode == "run" else "build"
        serial = next(self._ids)
        spec = None
        if self.sandboxed:
            hidden = [*sandbox.DEFAULT_HIDDEN, os.path.expanduser("~"), str(self.work_dir),
                      *self.hidden_paths]
            spec = SandboxSpec(hidden=hidden, readonly=[*sandbox.needed_paths(), str(self.cache_dir)],
                               writable=[str(build_dir)] if build_dir else [],
                               devices=sandbox.device_nodes(),
                               scratch_mb=self.options.scratch_mb,
                               max_processes=self.options.max_processes)
        return RunnerProcess(mode, self.device if mode == "run" else "cpu", self._env(device),
                             self.work_dir / "logs" / f"{mode}-{os.getpid()}-{serial}.log",
                             self.work_dir / "runs", sandbox=spec, uid=sandbox.outer_uid())

    @property
    def ready_info(self) -> RunnerReady | None:
        """What the last runner reported at start-up (device name, capability, versions)."""
        return self._ready

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
            current = self._current
        if current is not None:
            current.signal_kill()

    def _set_current(self, runner: RunnerProcess | None) -> bool:
        """Record the running subprocess; False when a cancel already came for this run."""
        with self._lock:
            self._current = runner
            return not self._cancel_requested

    def _cancelled(self) -> bool:
        return self._cancel_requested

    # ------------------------------------------------------------------ build
    def build(self, candidate: CandidateSource | CandidateSubmission | str) -> BuildResult:
        """Build the candidate's extensions into the shared cache (no-op when cached or none).

        Thread-safe and independent of `run()`, so builds of queued candidates can use CPU cores
        while this worker's device runs another candidate.
        """
        if isinstance(candidate, CandidateSubmission):
            candidate = candidate_from_text(candidate.candidate_source)
        elif isinstance(candidate, str):
            candidate = candidate_from_text(candidate)
        return self._build(candidate, slot=f"pre-{threading.get_ident()}")

    def _build(self, candidate: CandidateSource, slot: str) -> BuildResult:
        if not candidate.needs_build:
            return BuildResult()
        marker = self.cache_dir / "ext" / "by-source" / f"{candidate.sha256}.json"
        key = (str(self.cache_dir), candidate.sha256)
        while True:
            cached = _read_marker(marker)
            if cached is not None:
                cached.seconds = 0.0
                for record in cached.records:
                    record.cached = True
                return cached
            waiting = _INFLIGHT.claim(key)
            if waiting is None:
                break
            waiting.wait(self.options.build_timeout_s)
        try:
            return self._run_build(candidate, marker, slot)
        finally:
            _INFLIGHT.release(key)

    def _run_build(self, candidate: CandidateSource, marker: Path, slot: str) -> BuildResult:
        build_dir = self.work_dir / "build" / f"{slot}-{next(self._ids)}"
        build_dir.mkdir(parents=True, exist_ok=True)
        uid = sandbox.outer_uid()
        if self.sandboxed and uid is not None:
            os.chown(build_dir, uid, uid)
        began = time.monotonic()
        try:
            runner = self._new_runner("build", build_dir)
        except (RunnerError, sandbox.SandboxError) as exc:
            shutil.rmtree(build_dir, ignore_errors=True)
            return BuildResult(module_error=f"build process failed: {exc}", seconds=0.0)
        try:
            with self._lock:
                if slot == "run":
                    self._current = runner
            runner.wait_ready(self.options.spawn_timeout_s)
            runner.send(BuildJob(candidate_source=candidate.text, cache_dir=str(self.cache_dir),
                                 build_dir=str(build_dir)))
            result, why = runner.wait_result(
                BuildResult, self.options.build_timeout_s, "EvalOptions.build_timeout_s",
                _BUILD_MEMORY_MB, self._cancelled if slot == "run" else (lambda: False))
        except RunnerError as exc:
            runner.kill()
            return BuildResult(module_error=f"build process failed: {exc}",
                               seconds=time.monotonic() - began)
        finally:
            runner.remove_log()
            with self._lock:
                if slot == "run":
                    self._current = None
        if result is None:
            shutil.rmtree(build_dir, ignore_errors=True)
            return BuildResult(module_error=f"build {why}", seconds=time.monotonic() - began)
        assert isinstance(result, BuildResult)
        # The build process ran the candidate's module: only the worker writes the cache.
        publish_builds(self.cache_dir, candidate.sha256, build_dir, result.records)
        shutil.rmtree(build_dir, ignore_errors=True)
        for record in result.records:
            record.library = ""
        if result.records and all(r.ok or r.error for r in result.records):
            marker.parent.mkdir(parents=True, exist_ok=True)
            staging = marker.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            staging.write_bytes(msgspec.json.encode(result))
            os.replace(staging, marker)
        return result

    # ------------------------------------------------------------------ run
    def run(self, submission: CandidateSubmission, stage: str = "full",
            run_id: str | None = None) -> Verdict:
        """Evaluate one candidate; never raises for anything the candidate (or problem) does.

        `run_id` names this run for `cancel(run_id)`; a cancel for it that came first applies.
        """
        began = time.monotonic()
        if stage not in STAGES:
            raise UsageError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
        if self._pool is None:
            raise RuntimeError("EvalWorker.start() was not called (or close() was)")
        with self._lock:
            self._run_id = run_id
            self._cancel_requested = run_id is not None and run_id in self._early_cancels
            self._early_cancels.discard(run_id)   # type: ignore[arg-type]
        try:
            verdict = self._run(submission, stage, began)
        finally:
            with self._lock:
                self._run_id = None
        redact_verdict(verdict)
        verdict.sandbox = self.sandbox_status.kind
        verdict.stage = stage
        verdict.device = self.device
        verdict.stage_seconds["total"] = round(time.monotonic() - began, 4)
        self.evaluated += 1
        return verdict

    def _run(self, submission: CandidateSubmission, stage: str, began: float) -> Verdict:
        seconds: dict[str, float] = {}
        cpu_timing = not self.device.startswith("cuda")
        try:
            problem = problem_from_text(submission.problem_source, name=submission.problem_name
                                        or None)
        except UsageError as exc:
            return Verdict(error=f"problem source: {exc}", cpu_timing=cpu_timing)
        try:
            candidate = candidate_from_text(submission.candidate_source, problem=problem)
        except UsageError as exc:
            return Verdict(error=f"candidate source: {exc}", cpu_timing=cpu_timing)
        if self.refuses_candidates:
            return Verdict(error=(f"refused: this host cannot sandbox candidates "
                                  f"({self.sandbox_status.detail}); set EvalOptions.sandbox="
                                  f"'optional' (specgen-node --allow-unsandboxed) to run them "
                                  f"anyway"),
                           cpu_timing=cpu_timing)
        # Static checks come before any of the candidate's code runs, in a build or a runner.
        flags = scan_source(candidate.tree)
        if flags:
            return Verdict(flags=flags, cpu_timing=cpu_timing)

        build = self._build(candidate, slot="run")
        if candidate.needs_build:
            seconds["build"] = round(build.seconds, 4)
        if self._cancelled():
            return Verdict(error="cancelled", cpu_timing=cpu_timing, stage_seconds=seconds)
        if build.module_error and build.module_error.startswith("build "):
            return Verdict(error=f"extension {build.module_error}", cpu_timing=cpu_timing,
                           stage_seconds=seconds)

        assert self._pool is not None and self._ref_cache is not None
        try:
            runner, waited = self._pool.take(self.options.spawn_timeout_s)
        except RunnerError as exc:
            return Verdict(error=f"no runner: {exc}", cpu_timing=cpu_timing, stage_seconds=seconds)
        seconds["spare_wait"] = round(waited, 4)
        ready = runner.wait_ready(0)
        self._ready = ready
        if not self._set_current(runner):
            runner.kill()
            runner.remove_log()
            return Verdict(error="cancelled", cpu_timing=cpu_timing, stage_seconds=seconds)
        ref_timing = None
        if stage != "validate" and self.options.cache_ref_timing:
            ref_key = RefTimingCache.key(problem.sha256, self.device, ready, self.options)
            ref_timing = self._ref_cache.get(ref_key)
            if ref_timing is None:
                # Measured in a runner of its own, before the candidate's: a timing measured in
                # the candidate's process could be forged, and every later candidate's speedup
                # would be computed from it.
                reference = RunJob(stage="reference", problem_source=problem.text,
                                   problem_name=problem.name, candidate_source="",
                                   options=self.options, reported_device=self.device,
                                   **self._job_paths(runner, "reference"))
                ref_result, why = self._execute(runner, reference)
                if ref_result is None or ref_result.ref_timing is None:
                    error = ref_result.verdict.error if ref_result is not None else why
                    return Verdict(error=f"reference timing failed: {error}",
                                   cpu_timing=cpu_timing, stage_seconds=seconds)
                ref_timing = ref_result.ref_timing
                self._ref_cache.put(ref_key, ref_timing)
                seconds["reference"] = ref_result.verdict.stage_seconds.get("ref_timing", 0.0)
                try:
                    runner, waited = self._pool.take(self.options.spawn_timeout_s)
                except RunnerError as exc:
                    return Verdict(error=f"no runner: {exc}", cpu_timing=cpu_timing,
                                   stage_seconds=seconds)
                seconds["spare_wait"] = round(seconds["spare_wait"] + waited, 4)
                if not self._set_current(runner):
                    runner.kill()
                    runner.remove_log()
                    return Verdict(error="cancelled", cpu_timing=cpu_timing, stage_seconds=seconds)
        job = RunJob(stage=stage, problem_source=problem.text, problem_name=problem.name,
                     candidate_source=candidate.text, options=self.options,
                     reported_device=self.device, ref_timing=ref_timing,
                     **self._job_paths(runner, submission.candidate_id))
        result, why = self._execute(runner, job)
        if result is None:
            verdict = Verdict(error=why if why == "cancelled" else f"candidate {why}",
                              cpu_timing=cpu_timing)
            verdict.stage_seconds = seconds
            return verdict
        verdict = result.verdict
        if build.records and not any(r.ok for r in build.records) and verdict.error and \
                build.records[0].error and build.records[0].error not in verdict.error:
            verdict.error += f"; extension build: {build.records[0].error}"
        verdict.stage_seconds = {**seconds, **verdict.stage_seconds}
        return verdict


    def _job_paths(self, runner: RunnerProcess, label: str) -> dict[str, str]:
        """Where a job writes: inside a sandbox its private tmpfs, else the work directory."""
        if runner.sandboxed:
            return {"job_dir": f"{sandbox.SCRATCH}/job", "cache_dir": str(self.cache_dir),
                    "build_dir": f"{sandbox.SCRATCH}/build"}
        return {"job_dir": str(self.work_dir / "jobs" / f"{runner.pid}-{_safe(label)}"),
                "cache_dir": str(self.cache_dir), "build_dir": str(self.work_dir / "build" / "run")}

    def _execute(self, runner: RunnerProcess, job: RunJob) -> tuple[RunResult | None, str | None]:
        """Hand `job` to `runner`, wait for its result, then kill the runner (used once only)."""
        try:
            runner.send(job)
            result, why = runner.wait_result(
                RunResult, self.options.timeout_s, "EvalOptions.timeout_s",
                self.options.memory_limit_mb, self._cancelled)
        except RunnerError as exc:
            result, why = None, str(exc)
        finally:
            self._set_current(None)
            runner.kill()
            runner.remove_log()
            if not runner.sandboxed:
                shutil.rmtree(job.job_dir, ignore_errors=True)
        assert result is None or isinstance(result, RunResult)
        return result, why


def query_capability(device: str) -> str:
    """Compute capability of a CUDA device ("9.0") from nvidia-smi, without importing torch."""
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


def _read_marker(path: Path) -> BuildResult | None:
    try:
        return msgspec.json.decode(path.read_bytes(), type=BuildResult)
    except (OSError, msgspec.DecodeError, RecursionError):
        return None


def _safe(text: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:40]
    return cleaned or "candidate"
