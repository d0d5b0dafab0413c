from specgen.runtime.pools import PoolController, RateMeter, UsageMeter
from specgen.runtime.settings import RuntimeSettings


def test_rate_meter_counts_over_its_window() -> None:
    m = RateMeter(window_s=10.0)
    for i in range(50):
        m.add(100.0 + i * 0.2)          # 5 per second for 10 s
    assert abs(m.rate(110.0) - 5.0) < 0.3
    assert m.rate(130.0) == 0.0


def test_target_follows_offered_load_and_keeps_a_minimum() -> None:
    c = PoolController(RuntimeSettings(drain_horizon_s=5.0))
    for i in range(40):
        c.record_arrival("validate", 10.0 + i * 0.25)   # 4/s
        c.record_arrival("profile", 10.0 + i * 0.25)    # 4/s
    c.record_service("validate", 0.5)
    c.record_service("profile", 1.5)
    target = c.target_validators(20.0, 8, {"validate": 0, "profile": 0})
    assert target is not None and abs(target - 2.0) < 0.2       # load 2 : 6
    only_v = PoolController(RuntimeSettings())
    only_v.record_arrival("validate", 1.0)
    assert only_v.target_validators(2.0, 4, {"validate": 5, "profile": 0}) == 3   # min 1 profiler


def test_moves_need_hysteresis_and_spacing() -> None:
    s = RuntimeSettings(hysteresis_workers=0.35, rebalance_interval_s=1.0)
    c = PoolController(s)
    for i in range(20):
        c.record_arrival("validate", i * 0.1)
        c.record_arrival("profile", i * 0.1)
    c.record_service("validate", 1.0)
    c.record_service("profile", 1.2)           # target 1.82 of 4: close to 2, no move
    assert c.move(2.0, 4, 2, {"validate": 0, "profile": 0}) is None
    c.record_service("profile", 10.0)          # now profiling is far heavier
    donor = c.move(2.0, 4, 2, {"validate": 0, "profile": 0})
    assert donor == "validate"
    c.last_move = 2.0
    assert c.move(2.5, 4, 1, {"validate": 0, "profile": 0}) is None   # too soon after the last


def test_static_split_defaults_to_half_rounded_up() -> None:
    assert PoolController(RuntimeSettings(pool_mode="static")).static_validators(3) == 2
    assert PoolController(RuntimeSettings(pool_mode="static", static_validate_workers=1)).static_validators(3) == 1
    static = PoolController(RuntimeSettings(pool_mode="static"))
    static.record_arrival("validate", 0.0)
    assert static.move(10.0, 4, 2, {"validate": 100, "profile": 0}) is None


def test_usage_meter_integrates_busy_time_while_work_waits() -> None:
    u = UsageMeter(0.0)
    u.workers = {"validate": 2, "profile": 2}
    u.busy_now = {"validate": 2, "profile": 0}
    u.queued_now = 0
    u.advance(10.0)                                   # nothing waits: not counted as waiting
    u.busy_now = {"validate": 2, "profile": 1}
    u.queued_now = 3
    u.advance(20.0)                                   # 3 of 4 busy while work waits
    assert u.utilization("validate") == 1.0
    assert abs(u.utilization("profile") - 0.25) < 1e-9
    assert abs(u.busy_share_while_waiting() - 0.75) < 1e-9


def test_live_scheduler_moves_workers_between_pools_as_the_mix_changes() -> None:
    """Four replaying CPU workers; arrivals switch from validation-only to profiling-heavy."""
    import asyncio
    import time

    from specgen.messages import CandidateSubmission
    from specgen.runtime.local import LocalCluster
    from specgen.runtime.replay_evaluator import ReplaySample, directive

    from tests.runtime.conftest import wait_for

    settings = RuntimeSettings(rebalance_interval_s=0.3, rate_window_s=3.0, drain_horizon_s=2.0)
    with LocalCluster(workers=4, evaluator="replay", settings=settings) as cluster:
        backend = cluster.backend()

        def sizes() -> dict[str, int]:
            stats = cluster.client.stats()
            return {"validate": stats.validate.workers, "profile": stats.profile.workers}

        async def phase(tag: str, sample: ReplaySample, rate: float, seconds: float) -> None:
            for i in range(int(rate * seconds)):
                await backend.submit(CandidateSubmission(
                    job_id="mix", candidate_id=f"{tag}{i}", problem_name="mix", problem_source="",
                    candidate_source=directive(sample), extracted_at=time.time()))
                await asyncio.sleep(1.0 / rate)

        assert sizes() == {"validate": 2, "profile": 2}
        asyncio.run(phase("v", ReplaySample(validate_s=0.1, correct=False), rate=20, seconds=3))
        assert sizes() == {"validate": 3, "profile": 1}
        asyncio.run(phase("p", ReplaySample(validate_s=0.02, correct=True, profile_s=0.4), rate=8, seconds=4))
        wait_for(lambda: sizes() == {"validate": 1, "profile": 3}, 10, "the profiling pool to grow")
        stats = cluster.client.stats()
        assert stats.reassignments >= 3          # 2/2 -> 3/1 -> 1/3
        assert stats.feedback_latency_p95_s is not None
