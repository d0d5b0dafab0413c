"""The live progress display of `specgen optimize`.

On a terminal one status line is redrawn in place (at most ten times a second) and notable events
(iterations, verdicts, terminations) are printed above it; elsewhere (CI logs, pipes) only the
notable events are printed, each with the status, so a log reads as a story.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

from specgen.messages import JobProgress, OptimizeEvent


def status_line(progress: JobProgress) -> str:
    best = f"{progress.best_speedup:.2f}x" if progress.best_speedup is not None else "-"
    return (f"[{progress.elapsed_s:6.1f}s] it {progress.iteration} | reasoning "
            f"{progress.reasoning_tokens:,} tok | forks {progress.forks} "
            f"({progress.forks_running} running, {progress.fork_tokens:,} tok) | "
            f"validating {progress.validating}, profiling {progress.profiling}, "
            f"profiled {progress.profiled} | best {best}")


def _last_line(text: str | None) -> str:
    # The last line of an error or traceback names the exception; the rest is in result.json.
    lines = (text or "").strip().splitlines()
    return f": {lines[-1].strip()}" if lines else ""


def describe(event: OptimizeEvent) -> str | None:
    """A line for events worth a line; None for the rest."""
    kind = event.kind
    if kind == "job_started":
        return f"job {event.job_id}: {event.reason}"
    if kind == "iteration_started":
        return f"iteration {event.iteration + 1}: {event.reason}"
    if kind == "fork_started":
        return f"fork at token {event.position} ({event.reason})"
    if kind == "candidate":
        return f"candidate {event.candidate_id} from {event.origin} at token {event.position}"
    if kind == "duplicate":
        return f"candidate {event.candidate_id} ({event.origin}) is a duplicate: {event.reason}"
    if kind == "update" and event.update is not None:
        update = event.update
        verdict = update.verdict
        if update.cancelled:
            what = "cancelled"
        elif not verdict.compiled:
            what = "does not compile/load" + _last_line(verdict.error)
        elif verdict.flags:
            what = "rejected: " + "; ".join(verdict.flags)
        elif not verdict.correct:
            what = "wrong output" + _last_line(verdict.error)
        elif verdict.speedup is not None:
            what = f"correct, {verdict.speedup:.2f}x" + (" (CPU timing)" if verdict.cpu_timing else "")
        else:
            what = "correct"
        worker = f" on {update.worker}" if update.worker else ""
        return f"{update.stage} {event.candidate_id}{worker}: {what[:160]}"
    if kind in ("termination", "iteration_finished", "error", "job_finished",
                "reasoning_finished"):
        label = {"termination": "stop", "iteration_finished": "iteration done",
                 "reasoning_finished": "reasoning ended", "error": "error",
                 "job_finished": "finished"}[kind]
        return f"{label}: {event.reason}" if event.reason else label
    return None


class ProgressDisplay:
    """Feed it every event (it is an `emit` callback)."""

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None,
                 verbose: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.verbose = verbose
        self._last_draw = 0.0
        self._drawn = False

    def __call__(self, event: OptimizeEvent) -> None:
        line = describe(event)
        if event.kind in ("fork_started", "candidate") and not self.verbose and not self.live:
            line = None                       # frequent; the status line shows them in a log
        progress = event.progress or JobProgress()
        if line is not None:
            self._clear()
            if self.live:
                self.stream.write(f"{line}\n")
            else:
                self.stream.write(f"[{progress.elapsed_s:6.1f}s] {line}\n")
                if event.kind in ("update", "iteration_finished", "termination"):
                    self.stream.write(f"         {status_line(progress)}\n")
        if self.live:
            now = time.monotonic()
            if line is not None or now - self._last_draw >= 0.1:
                self._clear()
                self.stream.write(status_line(progress))
                self._drawn = True
                self._last_draw = now
        self.stream.flush()

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self._drawn = False
        self.stream.flush()

    def _clear(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[2K")
            self._drawn = False
