"""The job's candidates: numbered in order, a repeated program recorded and never submitted, each
journaled before the backend sees it, a refused submission lost; after a resume, a program found
again is the candidate it was."""
from __future__ import annotations

import asyncio
import json

from specgen.clock import SYSTEM_CLOCK
from specgen.messages import CandidateRecord, OptimizeSpec
from specgen.optimize.candidates import CandidateBook, answer_ids
from specgen.optimize.outputs import JOURNAL_DIR, LOOP_JOURNAL, LoopJournal, ResumedRun

PROGRAM = ("import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
           "        return x * 2\n")
SAME = PROGRAM.replace("return x * 2", "return x * 2  # doubled")
OTHER = PROGRAM.replace("x * 2", "x + x")


def spec(**kw) -> OptimizeSpec:
    return OptimizeSpec(job_id="j", problem_name="p", problem_source="ref", **kw)


class Backend:
    def __init__(self, journal_path=None, refuse: str | None = None) -> None:
        self.submitted = []
        self.journal_path = journal_path
        self.refuse = refuse
        self.cancelled: list[str] = []

    async def submit(self, submission) -> None:
        if self.journal_path is not None:    # what the journal holds when the backend sees it
            lines = self.journal_path.read_text().splitlines()
            assert submission.candidate_id in {json.loads(x)["record"]["candidate_id"] for x in lines}
        if self.refuse is not None and self.refuse in submission.candidate_source:
            raise RuntimeError("no room")
        self.submitted.append(submission)

    async def cancel_job(self, job_id: str) -> None:
        self.cancelled.append(job_id)


def book_of(backend, journal=None, events=None, lost=None, **kw) -> CandidateBook:
    async def on_lost() -> None:
        if lost is not None:
            lost.append(True)

    return CandidateBook(spec(**kw), backend, SYSTEM_CLOCK, journal,
                         lambda kind, **f: events.append((kind, f)) if events is not None else None,
                         on_lost=on_lost)


def test_candidates_are_numbered_in_order_and_a_repeat_is_never_submitted(tmp_path) -> None:
    events: list = []

    async def go():
        journal = LoopJournal(tmp_path)
        backend = Backend(tmp_path / JOURNAL_DIR / LOOP_JOURNAL)
        book = book_of(backend, journal, events, time_budget_s=60.0)
        book.start(1000.0)
        found: list[str] = []
        first = book.add(0, PROGRAM, "fork", "j/it0/fork0", 400, found)
        again = book.add(0, SAME, "final", "j/it0/reason", 900, found)
        other = book.add(1, OTHER, "inline", "j/it1/reason", 100, found)
        await book.close()
        journal.close()
        return book, backend, found, first, again, other

    book, backend, found, first, again, other = asyncio.run(go())
    assert first.candidate_id.startswith("c000-") and other.candidate_id.startswith("c002-")
    assert again.candidate_id.startswith("c001-") and again.duplicate_of == first.candidate_id
    assert again.status == "duplicate" and found == list(book.records)
    assert [s.candidate_id for s in backend.submitted] == [first.candidate_id, other.candidate_id]
    assert {s.deadline for s in backend.submitted} == {1060.0}
    assert [k for k, _ in events] == ["candidate", "duplicate", "candidate"]
    assert backend.cancelled == ["j"]          # two still pending: the backend drops them
    book.cancel_pending()
    assert [r.status for r in book.records.values()] == ["cancelled", "duplicate", "cancelled"]
    assert answer_ids([again, None, other]) == [first.candidate_id, other.candidate_id]


def test_a_refused_submission_loses_its_candidate_not_the_job() -> None:
    events: list = []
    lost: list = []

    async def go():
        backend = Backend(refuse="x + x")
        book = book_of(backend, events=events, lost=lost)
        book.start(0.0)
        refused = book.add(0, OTHER, "fork", "j/it0/fork0", 10, [])
        kept = book.add(0, PROGRAM, "fork", "j/it0/fork1", 20, [])
        await book.close()
        return refused, kept, backend

    refused, kept, backend = asyncio.run(go())
    assert refused.status == "lost" and kept.status == "pending" and lost == [True]
    assert ("error", {"candidate_id": refused.candidate_id,
                      "reason": "submission failed: no room"}) in events
    assert [s.candidate_id for s in backend.submitted] == [kept.candidate_id]


def test_after_a_resume_a_program_found_again_is_the_same_candidate() -> None:
    def record(cid: str, iteration: int, source: str, status: str) -> CandidateRecord:
        from specgen.optimize.dedup import fingerprint
        return CandidateRecord(candidate_id=cid, iteration=iteration, origin="fork",
                               request_id="r", position=1, fingerprint=fingerprint(source),
                               source=source, extracted_at=0.0, status=status)

    run = ResumedRun()
    for r in (record("c000-a", 0, OTHER, "incorrect"), record("c004-b", 1, PROGRAM, "pending")):
        run.candidates[r.candidate_id] = r

    async def go():
        backend = Backend()
        book = book_of(backend)
        book.restore(run)
        book.carry_over(first_iteration=1)
        book.start(0.0)
        await asyncio.sleep(0)
        again = book.carried(SAME)
        assert book.carried(SAME) is None              # once
        assert book.carried(OTHER) is None             # its iteration is not run again
        new = book.add(1, OTHER, "final", "j/it1/reason", 5, [])
        return backend, again, new

    backend, again, new = asyncio.run(go())
    assert again is run.candidates["c004-b"]
    assert [s.candidate_id for s in backend.submitted] == ["c004-b"]    # owed: submitted again
    assert new.candidate_id.startswith("c005-") and new.duplicate_of == "c000-a"
