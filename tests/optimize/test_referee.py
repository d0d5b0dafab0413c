"""Judging correct verdicts: the best kernel, and which termination the job is to act on."""
from __future__ import annotations

from specgen.clock import SYSTEM_CLOCK
from specgen.messages import (CandidateRecord, CandidateUpdate, IterationRecord, OptimizeSpec,
                              Verdict)
from specgen.optimize.candidates import CandidateBook
from specgen.optimize.iterations import IterationState
from specgen.optimize.referee import Referee
from specgen.optimize.termination import default_criterion


def spec(**kw) -> OptimizeSpec:
    return OptimizeSpec(job_id="j", problem_name="p", problem_source="ref", **kw)


def judge_of(speedups: dict[str, float | None], *, early: bool = True, target: float | None = 3.0
             ) -> tuple[Referee, CandidateBook]:
    book = CandidateBook(spec(), None, SYSTEM_CLOCK, None, lambda *a, **k: None, on_lost=None)
    for cid, speedup in speedups.items():
        record = CandidateRecord(candidate_id=cid, iteration=0, origin="fork", request_id="r",
                                 position=1, fingerprint=cid, source="", extracted_at=0.0)
        if speedup is not None:
            record.status = "correct"
            record.profile = CandidateUpdate(job_id="j", candidate_id=cid, stage="profile",
                                             verdict=Verdict(compiled=True, correct=True,
                                                             speedup=speedup))
            record.feedback_at = 1.0
        book.records[cid] = record
    judge = Referee(spec(target_speedup=target), default_criterion(target, 0.1), book,
                  early_termination=early)
    return judge, book


def running() -> IterationState:
    return IterationState(record=IterationRecord(index=0, started_at=0.0, baseline_speedup=1.0,
                                                 prompt=""))


def test_a_kernel_beating_the_ones_found_before_it_ends_the_running_iteration() -> None:
    judge, book = judge_of({"slow": 1.05, "fast": 1.6})
    current = running()
    found = judge.judge(book.records["fast"], current)
    assert found is not None and found[1] is book.records["fast"]
    assert found[0].scope == "iteration" and "beats 1.05x" in found[0].reason
    assert judge.best is book.records["fast"] and judge.target_reason is None
    current.halt("stopped already")
    assert judge.judge(book.records["fast"], current) is None       # nothing left to stop
    assert judge.judge(book.records["fast"], None) is None          # between iterations


def test_the_bar_is_the_best_kernel_found_before_not_the_margin_over_the_reference() -> None:
    # "b" was in the running iteration's prompt (its verdict came before the iteration began);
    # "c", found by this iteration, must beat it by the margin.
    for speedup, ends in ((2.1, False), (2.3, True)):
        judge, book = judge_of({"b": 2.0, "c": speedup})
        c = book.records["c"]
        c.iteration, c.feedback_at = 1, 6.0
        current = IterationState(record=IterationRecord(index=1, started_at=5.0,
                                                        baseline_speedup=2.0, prompt=""))
        found = judge.judge(c, current)
        assert (found is not None and found[1] is c) is ends
        assert judge.best is c


def test_the_target_is_kept_whether_or_not_the_job_stops_at_once() -> None:
    for early in (True, False):
        judge, book = judge_of({"a": 3.5}, early=early)
        found = judge.judge(book.records["a"], running())
        assert judge.target_reason == "a reached 3.5x (target 3x)"
        assert (found is not None and found[0].scope == "job") is early


def test_a_resume_takes_the_best_journaled_kernel_and_whether_it_reached_the_target() -> None:
    judge, book = judge_of({"a": 1.2, "b": 3.2, "c": None})
    judge.restore()
    assert judge.best is book.records["b"]
    assert judge.target_reason == "b reached 3.2x (target 3x) before the resume"
