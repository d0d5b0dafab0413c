from __future__ import annotations

import pytest

from specgen.messages import CandidateRecord, CandidateUpdate, ForkRecord, Verdict
from specgen.optimize.metrics import compute_metrics, percentile


def update(cid: str, stage: str, start: float, end: float, worker: str, **verdict) -> CandidateUpdate:
    return CandidateUpdate(job_id="j", candidate_id=cid, stage=stage, verdict=Verdict(**verdict),
                           worker=worker, started_at=start, finished_at=end)


def test_percentile() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 100) == 5.0


def test_metrics_from_history() -> None:
    t0 = 1000.0
    good = CandidateRecord(candidate_id="c0", iteration=0, origin="fork", request_id="f0",
                           position=100, fingerprint="a", source="s", extracted_at=t0 + 1,
                           status="correct", feedback_at=t0 + 5)
    good.validation = update("c0", "validate", t0 + 1, t0 + 2, "w0", compiled=True, correct=True)
    good.profile = update("c0", "profile", t0 + 2, t0 + 4, "w1", compiled=True, correct=True,
                          speedup=2.0)
    bad = CandidateRecord(candidate_id="c1", iteration=0, origin="fork", request_id="f1",
                          position=200, fingerprint="b", source="t", extracted_at=t0 + 2,
                          status="failed", feedback_at=t0 + 3)
    bad.validation = update("c1", "validate", t0 + 2, t0 + 3, "w0")
    dup = CandidateRecord(candidate_id="c2", iteration=0, origin="fork", request_id="f2",
                          position=300, fingerprint="a", source="s", extracted_at=t0 + 3,
                          status="duplicate", duplicate_of="c0")
    forks = [ForkRecord(request_id="f0", iteration=0, position=100, trigger="cue",
                        started_at=t0, prompt_tokens=300, cached_tokens=256)]
    m = compute_metrics(started_at=t0, finished_at=t0 + 10, candidates=[good, bad, dup],
                        forks=forks, iterations=[], reasoning_tokens=900, fork_tokens=100,
                        forks_skipped=2, workers_hint=0, best=good)
    assert m.end_to_end_s == 10 and m.time_to_best_s == 5
    assert (m.candidates, m.duplicates, m.validated, m.profiled, m.correct) == (2, 1, 2, 1, 1)
    assert m.total_tokens == 1000 and m.forks == 1 and m.forks_skipped == 2
    assert m.fork_cached_tokens == 256 and m.fork_prompt_tokens == 300
    assert m.validation_busy_s == pytest.approx(2.0) and m.profiling_busy_s == pytest.approx(2.0)
    assert m.workers == 2 and m.pool_utilization == pytest.approx(4.0 / 20.0)
    assert m.profiling_feedback_s == [pytest.approx(3.0)]
    assert sorted(m.validation_feedback_s) == [pytest.approx(1.0), pytest.approx(1.0)]
    assert m.feedback_p50_s == pytest.approx(3.0)
