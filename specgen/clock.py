"""Time as the decision logic sees it: a `Clock` passed in, never read from the `time` module.

The scheduler's core, its pool policy and the optimize loop ask an injected clock for the time so
that the same code runs on real time in production and on a virtual clock in a discrete-event
simulation, where time moves only when the simulator says so and a run is exactly repeatable.

    clock.now()            monotonic seconds (durations, rates, timeouts, tick cadence)
    clock.wall()           seconds since the epoch (timestamps that leave the process)
    await clock.sleep(s)   suspend the calling task for s seconds of this clock's time

`SystemClock` is the real one (the default everywhere). `VirtualClock` starts at a given time and
moves only through `advance(dt)` / `advance_to(t)`; timers (`call_at`, `call_later`) and sleeps
due by then fire in time order (ties in the order they were set), each seeing `now()` equal to its
own due time. Nothing in here reads the real time, so a simulation's figures are the same on
every run and take no real time to produce.

I/O timeouts (socket receives, process supervision) stay on real time: a virtual clock cannot make
a peer answer sooner.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar, runtime_checkable

T = TypeVar("T")


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""

    def wall(self) -> float:
        """Seconds since the epoch."""

    async def sleep(self, seconds: float) -> None:
        """Suspend the calling asyncio task for `seconds` of this clock's time."""


class SystemClock:
    """Real time: `time.monotonic`, `time.time`, `asyncio.sleep`."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()


class TimerHandle:
    """A pending callback of a `VirtualClock`; `cancel()` before it is due keeps it from firing."""

    __slots__ = ("when", "callback", "cancelled")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """A clock that stands still until told to move; deterministic.

    `wall()` is `now()` plus a fixed offset (`wall_start - start`), so wall timestamps and
    monotonic durations agree exactly. `advance` is meant to be called from the thread that owns
    the code under test; a sleeping asyncio task is woken through its own event loop, so it
    resumes the next time that loop runs.
    """

    def __init__(self, start: float = 0.0, wall_start: float | None = None) -> None:
        self._now = float(start)
        self._wall_offset = (float(wall_start) if wall_start is not None else float(start)) - self._now
        self._timers: list[tuple[float, int, TimerHandle]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    # -- timers ---------------------------------------------------------------------------
    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        """Run `callback` once the clock reaches `when` (at once on the next advance if past)."""
        timer = TimerHandle(float(when), callback)
        heapq.heappush(self._timers, (timer.when, next(self._seq), timer))
        return timer

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        return self.call_at(self._now + max(0.0, delay), callback)

    def next_due(self) -> float | None:
        """When the earliest pending timer is due (None: none pending): where a simulator jumps."""
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def pending(self) -> int:
        return sum(1 for _, _, t in self._timers if not t.cancelled)

    # -- moving -----------------------------------------------------------------------------
    def advance(self, dt: float) -> int:
        """Move forward by `dt` seconds; returns how many timers fired."""
        if dt < 0:
            raise ValueError(f"a clock does not go back: advance({dt})")
        return self.advance_to(self._now + dt)

    def advance_to(self, t: float) -> int:
        """Move forward to `t`, firing every timer due by then in time order (a timer set by a
        callback fires too when it is due by `t`); returns how many fired."""
        if t < self._now:
            raise ValueError(f"a clock does not go back: advance_to({t}) at {self._now}")
        fired = 0
        while self._timers and self._timers[0][0] <= t:
            when, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, when)
            timer.cancelled = True
            timer.callback()
            fired += 1
        self._now = t
        return fired

    # -- asyncio ------------------------------------------------------------------------------
    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            def settle() -> None:
                if not fut.done():
                    fut.set_result(None)
            loop.call_soon_threadsafe(settle)

        timer = self.call_later(seconds, wake)
        try:
            await fut
        finally:
            timer.cancel()

    def __repr__(self) -> str:
        return f"VirtualClock(now={self._now!r})"


async def wait_for(clock: Clock, awaitable: Awaitable[T], timeout: float | None) -> T:
    """`asyncio.wait_for` with the timeout measured on `clock` (TimeoutError when it runs out)."""
    if timeout is None or isinstance(clock, SystemClock):
        return await asyncio.wait_for(awaitable, timeout)
    work = asyncio.ensure_future(awaitable)
    timer = asyncio.ensure_future(clock.sleep(timeout))
    try:
        await asyncio.wait({work, timer}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()
        raise
    finally:
        timer.cancel()
    if work.done():
        return work.result()
    work.cancel()
    try:
        await work
    except asyncio.CancelledError:
        pass
    raise asyncio.TimeoutError()
