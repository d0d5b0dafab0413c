"""How a job ends: the first stop wins and is told once; the budgets stop it."""
from __future__ import annotations

import asyncio

from specgen.clock import SYSTEM_CLOCK, VirtualClock
from specgen.messages import OptimizeSpec
from specgen.optimize.job_end import JobEnd


def spec(**kw) -> OptimizeSpec:
    return OptimizeSpec(job_id="j", problem_name="p", problem_source="x", **kw)


def test_the_first_stop_wins_and_its_owner_is_told_once() -> None:
    told: list[tuple[str, str]] = []

    async def go() -> JobEnd:
        end = JobEnd(spec(token_budget=100), SYSTEM_CLOCK, lambda s, r: told.append((s, r)))
        end.check_tokens(60, 39)
        assert not end.is_set()
        end.check_tokens(60, 40)
        end.stop("cancelled", "too late to matter")
        return end

    end = asyncio.run(go())
    assert end.is_set() and end.status == "token_budget"
    assert end.reason == "token budget of 100 spent (60 reasoning + 40 fork tokens)"
    assert told == [("token_budget", end.reason)]


def test_a_failure_is_the_jobs_error_and_its_stop() -> None:
    async def go() -> JobEnd:
        end = JobEnd(spec(), SYSTEM_CLOCK, lambda s, r: None)
        end.fail("engine gone")
        end.fail("and then something else")
        return end

    end = asyncio.run(go())
    assert (end.status, end.reason, end.error) == ("failed", "engine gone", "engine gone")


def test_the_time_budget_is_watched_on_the_jobs_clock() -> None:
    async def go() -> JobEnd:
        clock = VirtualClock()
        end = JobEnd(spec(time_budget_s=5.0), clock, lambda s, r: None)
        watch = asyncio.create_task(end.watch_time())
        await asyncio.sleep(0)
        clock.advance(4.9)
        await asyncio.sleep(0)
        assert not end.is_set()
        clock.advance(0.2)
        await asyncio.wait_for(watch, 5)
        return end

    end = asyncio.run(go())
    assert (end.status, end.reason) == ("time_budget", "time budget of 5s spent")


def test_no_time_budget_no_watch() -> None:
    async def go() -> bool:
        end = JobEnd(spec(), VirtualClock(), lambda s, r: None)
        await asyncio.wait_for(end.watch_time(), 1)
        return end.is_set()

    assert asyncio.run(go()) is False
