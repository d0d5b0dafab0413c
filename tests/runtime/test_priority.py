import math

import pytest

from specgen.messages import CandidateSubmission
from specgen.runtime.priority import PriorityRule, QueuedRequest, RequestQueue


def req(seq: int, stage: str = "validate", deadline: float = math.inf, extracted: float = 0.0,
        origin: str = "fork", iteration: int = 0) -> QueuedRequest:
    sub = CandidateSubmission(job_id="j", candidate_id=f"c{seq}", problem_name="p", problem_source="",
                              candidate_source="", extracted_at=extracted, origin=origin, iteration=iteration)
    return QueuedRequest(key=("j", f"c{seq}", stage), stage=stage, submission=sub, seq=seq, deadline=deadline)


def drain(queue: RequestQueue) -> list[int]:
    out = []
    while (r := queue.pop()) is not None:
        out.append(r.seq)
    return out


def test_deadline_then_oldest() -> None:
    q = RequestQueue(PriorityRule(["deadline", "oldest"]))
    for r in (req(1, deadline=50, extracted=3), req(2, extracted=1), req(3, deadline=10, extracted=9),
              req(4, deadline=50, extracted=2)):
        q.push(r)
    assert drain(q) == [3, 4, 1, 2]


def test_newest_iteration_and_final_first() -> None:
    q = RequestQueue(PriorityRule(["final_first", "iteration", "newest"]))
    for r in (req(1, origin="fork", iteration=2, extracted=5), req(2, origin="final", iteration=0),
              req(3, origin="fork", iteration=2, extracted=7), req(4, origin="fork", iteration=1)):
        q.push(r)
    assert drain(q) == [2, 3, 1, 4]


def test_own_pool_orders_between_queues_only() -> None:
    rule = PriorityRule(["own_pool", "stage", "oldest"])
    validation, profiling = req(1, stage="validate"), req(2, stage="profile")
    assert rule.full_key(validation, "validate") < rule.full_key(profiling, "validate")
    assert rule.full_key(profiling, "profile") < rule.full_key(validation, "profile")
    no_affinity = PriorityRule(["stage", "oldest"])
    assert no_affinity.full_key(profiling, "validate") < no_affinity.full_key(validation, "validate")


def test_removal_is_lazy_and_counts_stay_right() -> None:
    q = RequestQueue(PriorityRule(["oldest"]))
    reqs = [req(i, extracted=i) for i in range(200)]
    for r in reqs:
        q.push(r)
    for r in reqs[:150]:
        q.remove(r)
    assert len(q) == 50
    assert q.peek() is reqs[150]
    assert drain(q) == list(range(150, 200))


def test_unknown_criteria_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown priority criteria"):
        PriorityRule(["deadline", "vibes"])


def test_live_scheduler_runs_requests_in_priority_order() -> None:
    """One replaying worker, busy while a mix of jobs and deadlines queues up behind it."""
    import asyncio
    import time

    from specgen.runtime.local import LocalCluster
    from specgen.runtime.replay import ReplaySample, directive
    from specgen.runtime.settings import RuntimeSettings

    settings = RuntimeSettings(priority_rule=["deadline", "stage", "oldest"])
    with LocalCluster(workers=1, evaluator="replay", settings=settings) as cluster:
        backend = cluster.backend()
        now = time.time()

        def sub(job: str, cid: str, sample: ReplaySample, deadline: float | None, extracted: float):
            return CandidateSubmission(job_id=job, candidate_id=cid, problem_name="p", problem_source="",
                                       candidate_source=directive(sample), deadline=deadline,
                                       extracted_at=extracted)

        ok = ReplaySample(validate_s=0.05, correct=True, profile_s=0.05, speedup=2.0)
        bad = ReplaySample(validate_s=0.05, correct=False)

        async def run() -> list[tuple[str, str]]:
            await backend.submit(sub("Z", "blocker", ReplaySample(validate_s=1.0, correct=False), None, now))
            await backend.submit(sub("A", "a1-ok", ok, now + 300, now + 1))
            await backend.submit(sub("B", "b1-ok", ok, now + 200, now + 2))
            await backend.submit(sub("B", "b2-bad", bad, now + 200, now + 3))
            await backend.submit(sub("A", "a2-bad", bad, now + 300, now + 0.5))
            seen = []
            async for upd in backend.updates():
                seen.append(upd)
                if len(seen) == 7:
                    break
            return [(u.candidate_id, u.stage) for u in sorted(seen, key=lambda u: u.started_at)]

        order = asyncio.run(run())
        assert order == [("blocker", "validate"), ("b1-ok", "validate"), ("b1-ok", "profile"),
                         ("b2-bad", "validate"), ("a2-bad", "validate"), ("a1-ok", "validate"),
                         ("a1-ok", "profile")]
