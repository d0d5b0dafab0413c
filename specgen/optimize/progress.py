"""The live progress display of `specgen optimize`.

On a terminal one status line is redrawn in place (at most ten times a second) and notable events
(iterations, verdicts, terminations) are printed above it; elsewhere (CI logs, pipes) only the
notable events are printed, each with the status, so a log reads as a story.

With a remote KV pool, the status carries the pool's figures (hit rate, bytes moved, evictions,
memory lent) from the latest `KvPoolStats` a source returns (`kv_pool`: a cheap callable, e.g.
optimize/kv_pool.py's `LiveKvStats`, which polls the scheduler in a thread of its own).
"""
from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from specgen.messages import JobProgress, KvPoolStats, OptimizeEvent


def status_line(progress: JobProgress) -> str:
    best = f"{progress.best_speedup:.2f}x" if progress.best_speedup is not None else "-"
    return (f"[{progress.elapsed_s:6.1f}s] it {progress.iteration} | reasoning "
            f"{progress.reasoning_tokens:,} tok | forks {progress.forks} "
            f"({progress.forks_running} running, {progress.fork_tokens:,} tok) | "
            f"validating {progress.validating}, profiling {progress.profiling}, "
            f"profiled {progress.profiled} | best {best}")


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} GiB"


def kv_pool_part(stats: KvPoolStats) -> str:
    """The KV pool's share of the status: hit rate, bytes moved (stored + loaded), evictions, and
    the memory it holds on the evaluation devices (lent to it until a profiling run needs it)."""
    looked_up = stats.hits + stats.misses
    hit = f"{stats.hit_rate:.0%} of {looked_up:,}" if looked_up else "-"
    moved = (stats.stores + stats.loads) * stats.slot_bytes
    return (f"KV pool hit {hit} | moved {_size(moved)} | evicted {stats.evictions:,} | "
            f"lent {_size(stats.capacity_bytes)}")


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
                 verbose: bool = False, kv_pool: Callable[[], KvPoolStats | None] | None = None) -> None:
        self.stream = stream or sys.stderr
        self.kv_pool = kv_pool                # settable later: the pool attaches once the cluster is up
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
                    self.stream.write(f"         {self._status(progress)}\n")
        if self.live:
            now = time.monotonic()
            if line is not None or now - self._last_draw >= 0.1:
                self._clear()
                self.stream.write(self._status(progress))
                self._drawn = True
                self._last_draw = now
        self.stream.flush()

    def _status(self, progress: JobProgress) -> str:
        line = status_line(progress)
        stats = self.kv_pool() if self.kv_pool is not None else None
        return f"{line} | {kv_pool_part(stats)}" if stats is not None else line

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self._drawn = False
        self.stream.flush()

    def _clear(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[2K")
            self._drawn = False
