"""Judging correct verdicts: the job's best kernel, and what the termination criterion says of them.

`Referee.judge` takes each correct verdict: it may be the job's best kernel, and the criterion is
asked about it and about every correct candidate the running iteration's prompt did not include,
each against the bar of the kernels found before it (a late verdict of an earlier kernel changes
the bar of later ones already judged: termination.py). A job-scope answer is the job's target
reached, kept even where early termination is off, so that the job stops at its next iteration; an
iteration-scope one is for the job to act on while that iteration still runs. The judge decides;
the job stops what is to stop.
"""
from __future__ import annotations

from specgen.messages import CandidateRecord, OptimizeSpec
from specgen.optimize.candidates import CandidateBook
from specgen.optimize.iterations import IterationState
from specgen.optimize.termination import (
    JobStanding,
    Termination,
    TerminationCriterion,
    VerdictView,
)


class Referee:
    """The best kernel (`best`) and the target (`target_reason`, once a kernel reached it) of the
    candidates in `book`."""

    def __init__(self, spec: OptimizeSpec, criterion: TerminationCriterion, book: CandidateBook, *,
                 early_termination: bool) -> None:
        self.spec = spec
        self.criterion = criterion
        self.book = book
        self.early_termination = early_termination
        self.best: CandidateRecord | None = None
        self.target_reason: str | None = None

    def restore(self) -> None:
        """After a resume: the best of the journaled verdicts, and whether it reached the target."""
        for record in self.book.records.values():
            if record.status == "correct" and record.speedup is not None and (
                    self.best is None or record.speedup > (self.best.speedup or 0.0)):
                self.best = record
        target = self.spec.target_speedup
        if target is not None and self.best is not None and (self.best.speedup or 0.0) >= target:
            self.target_reason = (f"{self.best.candidate_id} reached {self.best.speedup:.3g}x "
                                  f"(target {target:.3g}x) before the resume")

    def judge(self, record: CandidateRecord, current: IterationState | None
              ) -> tuple[Termination, CandidateRecord] | None:
        """A termination to act on now (job scope only with early termination on; iteration scope
        only while `current` runs unstopped) and the candidate that earned it, or None."""
        speedup = record.speedup
        if speedup is not None and (self.best is None or speedup > (self.best.speedup or 0.0)):
            self.best = record
        # The new verdict may also change the bar of candidates found after this one but judged
        # before it; ask again about every candidate the current iteration has not yet seen.
        for candidate in self._judgeable(current, record):
            termination = self.criterion.check(
                VerdictView(candidate.candidate_id, True, candidate.speedup),
                JobStanding(iteration=current.record.index if current else 0,
                            best_speedup=self.best.speedup if self.best else None,
                            bar=self._bar_before(candidate)))
            if termination is None:
                continue
            if termination.scope == "job":
                self.target_reason = self.target_reason or termination.reason
                return (termination, candidate) if self.early_termination else None
            if self.early_termination and current is not None and current.running \
                    and not current.stop.is_set():
                return termination, candidate
        return None

    def _judgeable(self, current: IterationState | None,
                   record: CandidateRecord) -> list[CandidateRecord]:
        """Correct candidates whose verdicts the current iteration's prompt did not include."""
        if current is None:
            return [record]
        began = current.record.started_at
        return [c for c in self.book.records.values() if c.status == "correct"
                and c.speedup is not None
                and (c.iteration == current.record.index or (c.feedback_at or 0.0) >= began)]

    def _bar_before(self, candidate: CandidateRecord) -> float:
        """Best correct speedup among candidates found before `candidate` (1.0 when none)."""
        best: float | None = None
        for other in self.book.records.values():     # in the order they were found
            if other is candidate:
                break
            if other.status == "correct" and other.speedup is not None:
                best = other.speedup if best is None else max(best, other.speedup)
        return 1.0 if best is None else best
