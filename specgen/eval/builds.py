"""A worker's builds of its candidates' `load_inline` extensions into the shared cache.

A candidate whose extensions are not built yet gets a **build runner** (forked from the worker's
template, no GPU), which compiles them and sends the libraries back; the worker publishes them
(eval/extensions.py) and writes a marker per candidate source (`ext/by-source/<sha256>.json`), so a
candidate built once is never built again. Builds of one source in this process are run once: a
thread that needs a build another thread is running waits for it instead of compiling twice.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable

import msgspec

from specgen.eval.extensions import publish_builds
from specgen.eval.loader import CandidateSource
from specgen.eval.runner_process import Runner, RunnerError
from specgen.messages import Build, BuildResult, EvalOptions


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
              track: Callable[..., bool] | None = None) -> BuildResult:
        """The candidate's build (cached, or run now). Inside a run, `cancelled` stops it and
        `track(runner)` / `track(runner, add=False)` lets the run's cancel reach its runner."""
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
            return self._run_build(candidate, marker, cancelled, track)
        finally:
            _INFLIGHT.release(key)

    def _run_build(self, candidate: CandidateSource, marker: Path,
                   cancelled: Callable[[], bool] | None, track: Callable[..., bool] | None
                   ) -> BuildResult:
        began = time.monotonic()
        try:
            runner = self._fork("build")
        except RunnerError as exc:
            return BuildResult(module_error=f"build runner failed: {exc}")
        if track is not None:
            track(runner)
        try:
            runner.wait_ready(self.options.spawn_timeout_s)
            received, why = runner.request(
                Build(candidate_source=candidate.text, cache_dir=str(self.cache_dir)),
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
                               seconds=time.monotonic() - began)
        result = received.message
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
