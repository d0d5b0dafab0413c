"""The clocks: the real one reads real time; the virtual one moves only when told, in order."""
from __future__ import annotations

import asyncio
import time

import pytest

from specgen.clock import SYSTEM_CLOCK, Clock, SystemClock, VirtualClock, wait_for


def test_system_clock_reads_real_time() -> None:
    clock = SystemClock()
    assert isinstance(clock, Clock)
    a, w = clock.now(), clock.wall()
    assert abs(w - time.time()) < 1.0
    assert clock.now() >= a

    async def nap() -> float:
        t0 = clock.now()
        await clock.sleep(0.01)
        return clock.now() - t0

    assert asyncio.run(nap()) >= 0.009


def test_virtual_clock_stands_still_until_advanced() -> None:
    clock = VirtualClock(start=100.0, wall_start=1_700_000_000.0)
    assert isinstance(clock, Clock)
    assert clock.now() == 100.0 and clock.wall() == 1_700_000_000.0
    time.sleep(0.01)
    assert clock.now() == 100.0
    clock.advance(2.5)
    assert clock.now() == 102.5 and clock.wall() == 1_700_000_002.5
    clock.advance_to(110.0)
    assert clock.now() == 110.0
    with pytest.raises(ValueError):
        clock.advance(-1)
    with pytest.raises(ValueError):
        clock.advance_to(109.0)


def test_virtual_timers_fire_in_time_order_each_at_its_time() -> None:
    clock = VirtualClock()
    seen: list[tuple[str, float]] = []
    clock.call_at(3.0, lambda: seen.append(("c", clock.now())))
    clock.call_at(1.0, lambda: seen.append(("a", clock.now())))
    clock.call_at(1.0, lambda: seen.append(("a2", clock.now())))    # a tie: the order set
    cancelled = clock.call_later(2.0, lambda: seen.append(("x", clock.now())))
    # A timer set by a callback fires in the same advance when it is due by then.
    clock.call_at(2.0, lambda: clock.call_later(0.5, lambda: seen.append(("b", clock.now()))))
    cancelled.cancel()
    assert clock.next_due() == 1.0 and clock.pending() == 4
    assert clock.advance(2.9) == 4
    assert seen == [("a", 1.0), ("a2", 1.0), ("b", 2.5)]
    assert clock.now() == 2.9 and clock.next_due() == 3.0
    assert clock.advance(10) == 1
    assert seen[-1] == ("c", 3.0) and clock.now() == 12.9
    assert clock.next_due() is None


def test_virtual_sleep_and_timeout_wake_in_order_in_no_real_time() -> None:
    clock = VirtualClock()
    order: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        order.append((name, clock.now()))

    async def never() -> None:
        await asyncio.Event().wait()

    async def settle() -> None:
        # As a simulator would: let every runnable task run before time moves.
        for _ in range(10):
            await asyncio.sleep(0)

    async def main() -> None:
        tasks = [asyncio.create_task(sleeper(n, s)) for n, s in (("long", 3600.0), ("short", 60.0))]
        timed = asyncio.create_task(wait_for(clock, never(), 600.0))
        quick = asyncio.create_task(wait_for(clock, sleeper("inner", 1.0), 600.0))
        await settle()
        while clock.next_due() is not None:
            clock.advance_to(clock.next_due())
            await settle()
        await asyncio.gather(*tasks, quick)
        with pytest.raises(asyncio.TimeoutError):
            await timed

    started = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - started < 2.0
    assert order == [("inner", 1.0), ("short", 60.0), ("long", 3600.0)]
    assert clock.now() == 3600.0


def test_system_wait_for_is_asyncio_wait_for() -> None:
    async def main() -> None:
        assert await wait_for(SYSTEM_CLOCK, asyncio.sleep(0, result=7), 1.0) == 7
        with pytest.raises(asyncio.TimeoutError):
            await wait_for(SYSTEM_CLOCK, asyncio.sleep(10), 0.01)

    asyncio.run(main())
