"""Verdict intake: the backend's updates onto the job's candidates, and bounded waits for them."""
from __future__ import annotations

import asyncio

from specgen.clock import SYSTEM_CLOCK
from specgen.messages import CandidateRecord, CandidateUpdate, OptimizeSpec, Verdict
from specgen.optimize.candidates import CandidateBook
from specgen.optimize.verdicts import Verdicts


def spec(**kw) -> OptimizeSpec:
    return OptimizeSpec(job_id="j", problem_name="p", problem_source="ref", **kw)


class Backend:
    def __init__(self, updates: list[CandidateUpdate]) -> None:
        self._updates = updates

    async def updates(self):
        for update in self._updates:
            await asyncio.sleep(0)
            yield update


def update(cid: str, stage: str, job: str = "j", cancelled: bool = False, **verdict) -> CandidateUpdate:
    return CandidateUpdate(job_id=job, candidate_id=cid, stage=stage, cancelled=cancelled,
                           verdict=Verdict(stage=stage, **verdict))


def parts(updates, events, correct, **kw) -> tuple[CandidateBook, Verdicts]:
    emit = lambda kind, **f: events.append((kind, f.get("candidate_id")))   # noqa: E731
    book = CandidateBook(spec(**kw), None, SYSTEM_CLOCK, None, emit, on_lost=None)
    for cid in ("a", "b", "c", "d"):
        book.records[cid] = CandidateRecord(candidate_id=cid, iteration=0, origin="fork",
                                            request_id="r", position=1, fingerprint=cid,
                                            source="", extracted_at=0.0)
    verdicts = Verdicts(spec(**kw), Backend(updates), book, SYSTEM_CLOCK, None, emit,
                        asyncio.Event(), on_correct=correct.append)
    return book, verdicts


def test_updates_become_statuses_and_a_correct_one_is_judged() -> None:
    events: list = []
    correct: list = []
    updates = [
        update("a", "validate", compiled=True, correct=True),
        update("a", "profile", compiled=True, correct=True, speedup=1.5),
        update("b", "validate", compiled=False),
        update("c", "validate", compiled=True, correct=False),
        update("d", "validate", job="other", compiled=True, correct=False),   # not this job's
        update("d", "validate", cancelled=True),
        update("b", "validate", compiled=True, correct=True),                 # b already failed
    ]

    async def go():
        book, verdicts = parts(updates, events, correct)
        await verdicts.consume()
        return book

    book = asyncio.run(go())
    assert {c: r.status for c, r in book.records.items()} == {
        "a": "correct", "b": "failed", "c": "incorrect", "d": "cancelled"}
    assert book.records["a"].speedup == 1.5 and book.records["a"].feedback_at is not None
    assert [r.candidate_id for r in correct] == ["a"]
    assert events == [("update", c) for c in ("a", "a", "b", "c", "d")]


def test_a_wait_ends_with_the_verdicts_or_loses_the_ones_owed() -> None:
    events: list = []

    async def go():
        book, verdicts = parts([update("a", "validate", compiled=False)], events, [],
                               verdict_timeout_s=0.2)
        consumer = asyncio.create_task(verdicts.consume())
        await verdicts.wait(["a"], asyncio.Event())           # comes in time
        await verdicts.wait(["b"], asyncio.Event())           # never comes
        await consumer
        return book

    book = asyncio.run(go())
    assert book.records["a"].status == "failed" and book.records["b"].status == "lost"
    assert events[-1] == ("error", None)


def test_a_wait_ends_when_its_stop_is_set() -> None:
    async def go():
        book, verdicts = parts([], [], [], verdict_timeout_s=60.0)
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.05, stop.set)
        await asyncio.wait_for(verdicts.wait(["a"], stop), 5)
        return book

    assert asyncio.run(go()).records["a"].status == "pending"
