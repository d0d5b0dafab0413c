"""How a job ends: why it stopped, and the budgets that stop it.

The first stop wins: its status ("target_reached", "iterations_done", "token_budget",
"time_budget", "cancelled", "failed") and reason are the job's, and a later one changes nothing,
so a budget spent while the job is already unwinding does not rename why it ended. `event` is set
then; everything that waits in the job watches it. The token budget is asked after every delta
(a job overshoots it by at most one delta per stream in flight); the wall-time budget is a
watchdog on the job's clock.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from specgen.clock import Clock
from specgen.messages import OptimizeSpec, OptimizeStatus


class JobEnd:
    """The job's stop; `on_stop(status, reason)` is told once, when it comes."""

    def __init__(self, spec: OptimizeSpec, clock: Clock,
                 on_stop: Callable[[OptimizeStatus, str], None]) -> None:
        self.spec = spec
        self.clock = clock
        self._on_stop = on_stop
        self.status: OptimizeStatus | None = None
        self.reason = ""
        self.error: str | None = None
        self.event = asyncio.Event()

    def is_set(self) -> bool:
        return self.event.is_set()

    def stop(self, status: OptimizeStatus, reason: str) -> None:
        if self.status is not None:
            return
        self.status, self.reason = status, reason
        self.event.set()
        self._on_stop(status, reason)

    def fail(self, message: str) -> None:
        self.error = self.error or message
        self.stop("failed", message)

    def check_tokens(self, reasoning_tokens: int, fork_tokens: int) -> None:
        budget = self.spec.token_budget
        if budget is not None and reasoning_tokens + fork_tokens >= budget:
            self.stop("token_budget", f"token budget of {budget} spent "
                                      f"({reasoning_tokens} reasoning + {fork_tokens} fork tokens)")

    async def watch_time(self) -> None:
        if self.spec.time_budget_s is None:
            return
        await self.clock.sleep(self.spec.time_budget_s)
        self.stop("time_budget", f"time budget of {self.spec.time_budget_s:g}s spent")
