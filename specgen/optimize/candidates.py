"""A job's candidates: numbered, deduplicated, journaled and submitted for evaluation.

Every program the job finds (a fork's output, a draft in the reasoning, an answer) comes to
`CandidateBook.add`. A new one gets the next ordinal in its id, is journaled, and is submitted to the
evaluation backend at once, in a task of its own so that a slow submission holds up no stream; one
that repeats an earlier program is recorded as that program's duplicate and never submitted. After
a resume, a program the killed run had found is that same candidate again (`carried`), and the
ones still owed a verdict are submitted again under their ids.
"""
from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable

from specgen.backend import EvaluationBackend
from specgen.clock import Clock
from specgen.messages import CandidateOrigin, CandidateRecord, CandidateSubmission, OptimizeSpec
from specgen.optimize.dedup import Deduplicator, fingerprint
from specgen.optimize.outputs import LoopJournal, ResumedRun
from specgen.runtime.ids import new_id

log = logging.getLogger(__name__)

EmitFn = Callable[..., None]

_ORDINAL = re.compile(r"c(\d+)")   # the ordinal that starts a candidate id ("c007-<random>")


def answer_ids(answers: list[CandidateRecord | None]) -> list[str]:
    """The candidates whose verdicts stand for these answers: an answer that repeats an earlier
    program (a fork or a draft wrote it first) is judged by that program's evaluation."""
    return [a.duplicate_of or a.candidate_id for a in answers if a is not None]


class CandidateBook:
    """The job's candidates in the order they were found (`records`) and their submissions."""

    def __init__(self, spec: OptimizeSpec, backend: EvaluationBackend, clock: Clock,
                 journal: LoopJournal | None, emit: EmitFn,
                 on_lost: Callable[[], Awaitable[None]]) -> None:
        self.spec = spec
        self.backend = backend
        self.clock = clock
        self.journal = journal
        self._emit = emit
        self._on_lost = on_lost               # a submission failed: its candidate has its verdict
        self.records: dict[str, CandidateRecord] = {}
        self.dedup = Deduplicator()
        self._count = 0
        self._deadline: float | None = None
        self._tasks: set[asyncio.Task] = set()
        self._carried: dict[str, CandidateRecord] = {}   # fingerprint -> found before a resume
        self._resubmit: list[CandidateRecord] = []

    # ------------------------------------------------------------------------------ resume

    def restore(self, run: ResumedRun) -> None:
        """Take the journaled candidates, ids and programs as they were."""
        for record in run.candidates.values():
            self.records[record.candidate_id] = record
            self.dedup.admit(record.source, record.candidate_id)
            ordinal = _ORDINAL.match(record.candidate_id)
            if ordinal is not None:
                self._count = max(self._count, int(ordinal.group(1)) + 1)

    def carry_over(self, first_iteration: int) -> None:
        """After the journaled verdicts are on the records: the programs the iteration run again
        may find again, and the candidates still owed a verdict, to submit again."""
        for record in self.records.values():
            if record.duplicate_of is None and record.iteration >= first_iteration:
                self._carried.setdefault(record.fingerprint, record)
        self._resubmit = [r for r in self.records.values() if r.status == "pending"]

    def carried(self, source: str) -> CandidateRecord | None:
        """The candidate of the run before a resume that was this program, once."""
        if not self._carried:
            return None
        return self._carried.pop(fingerprint(source), None)

    def found_again(self, record: CandidateRecord, iteration: int, request_id: str,
                    position: int, found_in: list[str]) -> None:
        """The iteration a resume replays found a program its first run had found: the same
        candidate (its id, its verdicts or its evaluation still owed), not a new one."""
        found_in.append(record.candidate_id)
        self._emit("candidate", iteration=iteration, request_id=request_id,
                   candidate_id=record.candidate_id, origin=record.origin, position=position,
                   reason="found again after a resume: evaluated once, under its first id")

    # ------------------------------------------------------------------------------ new ones

    def start(self, started_at: float) -> None:
        """The job started: its evaluations are due by its time budget's end; those a resume
        left owed are submitted again."""
        if self.spec.time_budget_s is not None:
            self._deadline = started_at + self.spec.time_budget_s
        for record in self._resubmit:
            self._start_submit(record)

    def add(self, iteration: int, source: str, origin: CandidateOrigin, request_id: str, position: int,
            found_in: list[str]) -> CandidateRecord:
        # The ordinal reads in order; the random rest makes the id unguessable (runtime/ids.py).
        candidate_id = new_id(f"c{self._count:03d}")
        self._count += 1
        admission = self.dedup.admit(source, candidate_id)
        record = CandidateRecord(candidate_id=candidate_id, iteration=iteration,
                                 origin=origin, request_id=request_id, position=position,
                                 fingerprint=admission.fingerprint, source=source,
                                 extracted_at=self.clock.wall())
        found_in.append(candidate_id)
        self.records[candidate_id] = record
        if admission.duplicate_of is not None:
            record.duplicate_of = admission.duplicate_of
            record.status = "duplicate"
        if self.journal is not None:
            # Before it is submitted: a candidate the backend has seen is always in the journal.
            self.journal.candidate(record)
        if record.status == "duplicate":
            self._emit("duplicate", iteration=record.iteration, request_id=request_id,
                       candidate_id=candidate_id, origin=origin, position=position,
                       reason=f"same program as {admission.duplicate_of}")
            return record
        self._start_submit(record)
        self._emit("candidate", iteration=record.iteration, request_id=request_id,
                   candidate_id=candidate_id, origin=origin, position=position)
        return record

    def _start_submit(self, record: CandidateRecord) -> None:
        submission = CandidateSubmission(
            job_id=self.spec.job_id, candidate_id=record.candidate_id,
            problem_name=self.spec.problem_name, problem_source=self.spec.problem_source,
            candidate_source=record.source, origin=record.origin, iteration=record.iteration,
            extracted_at=record.extracted_at, deadline=self._deadline,
        )
        task = asyncio.create_task(self._submit(record, submission),
                                   name=f"submit-{record.candidate_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _submit(self, record: CandidateRecord, submission: CandidateSubmission) -> None:
        try:
            await self.backend.submit(submission)
        except Exception as exc:  # a refused submission costs that candidate, not the job
            log.warning("submitting %s failed: %s", record.candidate_id, exc)
            record.status = "lost"
            self._emit("error", candidate_id=record.candidate_id,
                       reason=f"submission failed: {exc}")
            await self._on_lost()

    # ------------------------------------------------------------------------------ job end

    async def close(self) -> None:
        """At the job's end: submissions already sent land first, or they would run after the
        cancel; then the backend drops whatever of the job it still queues or runs."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if any(r.status == "pending" for r in self.records.values()):
            try:
                await self.backend.cancel_job(self.spec.job_id)
            except Exception as exc:
                log.warning("cancelling job %s at the backend failed: %s", self.spec.job_id, exc)

    def cancel_pending(self) -> None:
        """A candidate still owed a verdict once the job has stopped reading them gets none."""
        for record in self.records.values():
            if record.status == "pending":
                record.status = "cancelled"
