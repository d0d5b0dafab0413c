"""A suite's one progress display.

On a terminal, a rich live panel redrawn in place: jobs done of the total, then one line per
running job (elapsed, iteration, tokens, verdicts, best speedup so far). Elsewhere (CI logs,
pipes, tests) a line per job started and finished, so a log reads in order. Jobs report from
their follower threads, hence the lock.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Any


class SuiteProgress:
    def __init__(self, total: int, finished: int, quiet: bool = False, stream: Any = None) -> None:
        self.total, self.done = total, finished
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.running: dict[str, tuple[float, Any]] = {}     # key text -> (start, latest progress)
        self.lock = threading.Lock()
        self.live = None
        if not quiet and self.stream.isatty():
            from rich.console import Console
            from rich.live import Live

            self.live = Live(self, console=Console(file=self.stream), refresh_per_second=4,
                             transient=True)
            self.live.start()

    def _say(self, text: str) -> None:
        if self.quiet:
            return
        if self.live is not None:
            self.live.console.print(text, highlight=False, markup=False)
        else:
            print(text, file=self.stream, flush=True)

    def started(self, key: Any) -> None:
        with self.lock:
            self.running[key.text] = (time.monotonic(), None)
        if self.live is None:
            self._say(f"[{self.done}/{self.total}] started {key.text}")

    def event(self, key: Any, event: Any) -> None:
        if event.progress is None:
            return
        with self.lock:
            if key.text in self.running:
                self.running[key.text] = (self.running[key.text][0], event.progress)

    def finished(self, key: Any, row: dict[str, Any] | None) -> None:
        with self.lock:
            self.running.pop(key.text, None)
            if row is not None:
                self.done += 1
        if row is None:
            self._say(f"[{self.done}/{self.total}] {key.text}: cancelled")
            return
        best = (f"{row['speedup']:.2f}x" + (" CPU" if row.get("cpu_timing") else "")
                if row.get("speedup") is not None else "no correct kernel")
        self._say(f"[{self.done}/{self.total}] {key.text}: {row['status']} in "
                  f"{row['end_to_end_s']:.1f} s, best {best}, {row['iterations']} iteration(s), "
                  f"{row['tokens']:,} tokens, {row['feedback']} profiled")

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table(title=f"suite: {self.done}/{self.total} jobs done, {len(self.running)} running",
                      title_justify="left", box=None, pad_edge=False)
        for column in ("job", "elapsed", "it", "tokens", "validating", "profiled", "best"):
            table.add_column(column, justify="left" if column == "job" else "right")
        now = time.monotonic()
        with self.lock:
            running = list(self.running.items())
        for text, (start, progress) in running:
            if progress is None:
                table.add_row(text, f"{now - start:.0f}s", "-", "-", "-", "-", "-")
                continue
            best = f"{progress.best_speedup:.2f}x" if progress.best_speedup is not None else "-"
            table.add_row(text, f"{now - start:.0f}s", str(progress.iteration),
                          f"{progress.reasoning_tokens + progress.fork_tokens:,}",
                          str(progress.validating), str(progress.profiled), best)
        return table

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
