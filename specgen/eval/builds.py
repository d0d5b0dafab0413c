"""A worker's builds of its candidates' `load_inline` extensions into the shared cache.

A candidate whose extensions are not built yet gets a **build runner** (forked from the worker's
template, no GPU), which compiles every call the candidate makes (at import, in `ModelNew`'s
constructor and in its first forward: eval/discovery.py, given the problem) and sends the
libraries back; the worker publishes them (eval/extensions.py) and writes a marker per candidate
source, problem and scale (`ext/by-source/<hash>.json`), so a candidate built once is never built
again, across jobs and restarts. Builds of one marker in this process are run once: a thread that
needs a build another thread is running waits for it instead of compiling twice. Builds of
different candidates run at once, each in its own runner, as many as the callers' threads.

The worker also makes, once per cache and set of flags and in the background, the precompiled
torch headers of eval/pch.py that later builds of those flags use.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import msgspec

from specgen.eval import pch
from specgen.eval.extensions import publish_builds
from specgen.eval.loader import CandidateSource, ProblemSource
from specgen.eval.runner_process import Runner, RunnerError
from specgen.messages import Build, BuildResult, EvalOptions, LoadProblem

# `SPECGEN_BUILD_PCH=1`: precompiled torch headers for C++ builds (eval/pch.py). Off unless asked for: a CUDA build (what GPU candidates make) gains nothing from it (its time is
# the .cu compile), while each set of flags costs a 0.8 GB header and 80 s of a core to make; a
# C++-only build takes half the time with it (BENCHMARKS.md, "Builds").
PCH_ENABLED = os.environ.get("SPECGEN_BUILD_PCH", "0") == "1"


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


class Builds:
    """One worker's builds: `fork` gives it a build runner (it raises RunnerError once the worker
    is closed)."""

    def __init__(self, cache_dir: Path, options: EvalOptions, fork: Callable[[str], Runner]) -> None:
        self.cache_dir = cache_dir
        self.options = options
        self._fork = fork

    def build(self, candidate: CandidateSource, cancelled: Callable[[], bool] | None = None,
              track: Callable[..., bool] | None = None, problem: ProblemSource | None = None,
              scale: str = "small") -> BuildResult:
        """The candidate's build (cached, or run now). With `problem` (at `scale`, the run's) the
        build also finds the calls made by `ModelNew(*get_init_inputs())` and its first forward;
        without, those the module makes and those written with arguments its globals give.
        Inside a run, `cancelled` stops it and `track(runner)` / `track(runner, add=False)` lets
        the run's cancel reach its runner."""
        if not candidate.needs_build:
            return BuildResult()
        if PCH_ENABLED:
            _PCHS.prepare(self.cache_dir, candidate.text)
        marker = self.cache_dir / "ext" / "by-source" / f"{marker_name(candidate, problem, scale)}.json"
        key = (str(self.cache_dir), marker.name)
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
            return self._run_build(candidate, marker, cancelled, track,
                                   _load_request(problem, scale))
        finally:
            _INFLIGHT.release(key)

    def _run_build(self, candidate: CandidateSource, marker: Path,
                   cancelled: Callable[[], bool] | None, track: Callable[..., bool] | None,
                   problem: LoadProblem | None) -> BuildResult:
        began = time.monotonic()
        try:
            runner = self._fork("build")
        except RunnerError as exc:
            return BuildResult(module_error=f"build runner failed: {exc}", unfinished=True)
        if track is not None:
            track(runner)
        try:
            runner.wait_ready(self.options.spawn_timeout_s)
            received, why = runner.request(
                Build(candidate_source=candidate.text, cache_dir=str(self.cache_dir),
                      problem=problem),
                time.monotonic() + self.options.build_timeout_s, "EvalOptions.build_timeout_s",
                cancelled or (lambda: False))
        except RunnerError as exc:
            received, why = None, str(exc)
        finally:
            runner.kill()
            runner.remove_log()
            if track is not None:
                track(runner, add=False)
        if received is None or not isinstance(received.message, BuildResult):
            return BuildResult(module_error=f"build {why or 'runner answered something else'}",
                               seconds=time.monotonic() - began, unfinished=True)
        result = received.message
        result.unfinished = False       # the runner's own answer: it finished, whatever it says
        # The build runner ran the candidate's module: only the worker writes the cache.
        publish_builds(self.cache_dir, candidate.sha256, result)
        result.libraries = []
        if result.records and all(r.ok or r.error for r in result.records):
            marker.parent.mkdir(parents=True, exist_ok=True)
            staging = marker.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            staging.write_bytes(msgspec.json.encode(result))
            os.replace(staging, marker)
        return result


def _read_marker(path: Path) -> BuildResult | None:
    try:
        return msgspec.json.decode(path.read_bytes(), type=BuildResult)
    except (OSError, msgspec.DecodeError, RecursionError):
        return None


def marker_name(candidate: CandidateSource, problem: ProblemSource | None, scale: str) -> str:
    """The candidate's source hash; with a problem, a hash of the three: what its constructor
    and forward build depends on the problem's sizes."""
    if problem is None:
        return candidate.sha256
    return hashlib.sha256(f"{candidate.sha256}:{problem.sha256}:{scale}".encode()).hexdigest()


def _load_request(problem: ProblemSource | None, scale: str) -> LoadProblem | None:
    if problem is None:
        return None
    # The seed only fills parameters, which the build's meta tensors do not hold.
    return LoadProblem(problem_source=problem.text, problem_name=problem.name, scale=scale,
                       init_seed=1)


class _PchMaker:
    """Makes the precompiled headers a candidate's builds could use (`pch.variants`, read from its
    source), one at a time, in a process of its own (the worker imports no torch) and in the
    background: the build that first needs one does not wait for it, later ones use it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: set[tuple[str, str]] = set()
        self._queue: list[tuple[Path, list[tuple[bool, list[str]]]]] = []
        self._thread: threading.Thread | None = None

    def prepare(self, cache_dir: Path, candidate_text: str) -> None:
        wanted = []
        for variant in pch.variants(candidate_text):
            token = (str(cache_dir), json.dumps(variant))
            with self._lock:
                if token not in self._asked:
                    self._asked.add(token)
                    wanted.append(variant)
        if not wanted:
            return
        with self._lock:
            self._queue.append((cache_dir, wanted))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._drain, daemon=True,
                                                name="specgen-pch")
                self._thread.start()

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._thread = None
                    return
                cache_dir, variants = self._queue.pop(0)
            try:
                subprocess.run([sys.executable, "-m", "specgen.eval.pch", str(cache_dir),
                                json.dumps(variants)], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=3600, check=False)
            except (OSError, subprocess.SubprocessError):
                continue   # no PCH: builds go on as torch makes them


_PCHS = _PchMaker()
