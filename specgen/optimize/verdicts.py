"""A job's verdict intake: the backend's updates read onto its candidates, and the waits for them.

`Verdicts.consume` reads the backend's update stream for the whole job: each update for one of the
job's candidates still owed a verdict is journaled, recorded on the candidate (validated, profiled,
failed, cancelled) and shown to the job's referee when it is correct. Whoever waits for verdicts
(an iteration for its answers, the job's end for what it still owes) waits on one condition
notified at every update, bounded by `verdict_timeout_s`: a candidate whose verdict does not come
in time is lost, not waited for forever.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from specgen.backend import EvaluationBackend
from specgen.clock import Clock, wait_for
from specgen.messages import CandidateRecord, CandidateUpdate, OptimizeSpec
from specgen.optimize.candidates import CandidateBook
from specgen.optimize.outputs import LoopJournal

EmitFn = Callable[..., None]

# Verdict statuses after which a candidate needs nothing more from the backend.
FINAL = {"failed", "incorrect", "correct", "cancelled", "duplicate", "lost"}


class Verdicts:
    """Updates onto `book`'s records; `on_correct` judges a candidate found correct."""

    def __init__(self, spec: OptimizeSpec, backend: EvaluationBackend, book: CandidateBook,
                 clock: Clock, journal: LoopJournal | None, emit: EmitFn,
                 job_stop: asyncio.Event, on_correct: Callable[[CandidateRecord], None]) -> None:
        self.spec = spec
        self.backend = backend
        self.book = book
        self.clock = clock
        self.journal = journal
        self._emit = emit
        self._job_stop = job_stop
        self._on_correct = on_correct
        self._news = asyncio.Condition()

    def replay(self, updates: list[CandidateUpdate]) -> None:
        """A resumed run's journaled updates, onto the candidates they were for."""
        for update in updates:
            record = self.book.records.get(update.candidate_id)
            if record is not None and record.status not in FINAL:
                self._record(record, update)

    async def consume(self) -> None:
        async for update in self.backend.updates():
            if update.job_id != self.spec.job_id:
                continue
            record = self.book.records.get(update.candidate_id)
            if record is None or record.status in FINAL:
                continue
            if update.stage == "validate" and record.validation is not None:
                continue   # a backend answering a resubmitted candidate repeats what it said
            self._apply(record, update)
            await self.notify()

    async def notify(self) -> None:
        """Wake the waits: a candidate's status changed."""
        async with self._news:
            self._news.notify_all()

    def _apply(self, record: CandidateRecord, update: CandidateUpdate) -> None:
        if self.journal is not None:
            self.journal.update(update)
        self._record(record, update)
        self._emit("update", iteration=record.iteration, candidate_id=record.candidate_id,
                   origin=record.origin, update=update)
        if record.status == "correct":
            self._on_correct(record)

    def _record(self, record: CandidateRecord, update: CandidateUpdate) -> None:
        verdict = update.verdict
        if update.cancelled:
            record.status = "cancelled"
        elif update.stage == "validate":
            record.validation = update
            if not verdict.correct:
                record.status = "failed" if (not verdict.compiled or verdict.flags) else "incorrect"
        else:  # "profile" or "full"
            if update.stage == "full" and verdict.speedup is None:
                record.validation = update
            else:
                record.profile = update
            if verdict.correct:
                record.status = "correct"
            else:
                record.status = "failed" if (not verdict.compiled or verdict.flags) else "incorrect"
        if record.status != "pending":
            record.feedback_at = self.clock.wall()

    async def wait(self, candidate_ids: list[str], stop: asyncio.Event) -> None:
        """Until every one of `candidate_ids` has its verdict, `stop` or the job stops, or
        `verdict_timeout_s` passes (then the ones still owed are lost)."""
        records = self.book.records

        def settled() -> bool:
            return stop.is_set() or self._job_stop.is_set() or all(
                records[c].status in FINAL for c in candidate_ids)

        stop_watch = asyncio.create_task(self._notify_on(stop))
        try:
            async with self._news:
                await wait_for(self.clock, self._news.wait_for(settled),
                               self.spec.verdict_timeout_s)
        except asyncio.TimeoutError:
            lost = [c for c in candidate_ids if records[c].status not in FINAL]
            for candidate_id in lost:
                records[candidate_id].status = "lost"
            self._emit("error", reason=f"no verdict for {', '.join(lost)} within "
                                       f"verdict_timeout_s={self.spec.verdict_timeout_s:g}s")
        finally:
            stop_watch.cancel()

    async def _notify_on(self, event: asyncio.Event) -> None:
        await event.wait()
        await self.notify()
