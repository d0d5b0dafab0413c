"""The built-in evaluate_candidates job, through a real scheduler with replaying workers."""
from specgen.runtime.local import LocalCluster
from specgen.runtime.replay_evaluator import ReplaySample, directive

ENTRY = "specgen.runtime.jobs:evaluate_candidates"
PROBLEM = "class Model:\n    pass\n"


def test_stops_early_at_the_target_and_drops_the_rest() -> None:
    fast = directive(ReplaySample(validate_s=0.01, correct=True, profile_s=0.01, speedup=5.0))
    meh = directive(ReplaySample(validate_s=0.01, correct=True, profile_s=0.01, speedup=1.1))
    slow = directive(ReplaySample(validate_s=20.0, correct=True, profile_s=0.01, speedup=9.0))
    with LocalCluster(workers=2, evaluator="replay") as cluster:
        job = cluster.client.submit(PROBLEM, entry=ENTRY, options={
            "candidates": {"meh": meh, "fast": fast, "slow1": slow, "slow2": slow},
            "target_speedup": 3.0})
        result = job.result(timeout=60)
        events = list(job.events(timeout=10))
    assert result.status == "succeeded" and result.best_candidate_id == "fast"
    assert result.summary["stopped_early"] is True
    cancelled = {e.data["candidate_id"] for e in events if e.kind == "verdict" and e.data["cancelled"]}
    assert {"slow1", "slow2"} <= cancelled and "fast" not in cancelled
    assert [e.data["speedup"] for e in events if e.kind == "best"][-1] == 5.0


def test_missing_candidates_option_fails_the_job_with_a_clear_error() -> None:
    with LocalCluster(workers=1, evaluator="replay") as cluster:
        result = cluster.client.submit(PROBLEM, entry=ENTRY).result(timeout=60)
    assert result.status == "failed" and "options['candidates']" in (result.error or "")


def test_the_optimize_loop_runs_as_a_scheduler_job_by_default() -> None:
    """No entry given: the scheduler's default runs specgen's optimize loop in the reasoner, here
    replaying the problem's bundled trace, with every candidate evaluated for real."""
    from tests.runtime.conftest import PROBLEMS, quick_eval_settings

    with LocalCluster(workers=2, settings=quick_eval_settings()) as cluster:
        job = cluster.client.submit(PROBLEMS / "fused_elementwise.py", max_iterations=1,
                                    options={"engine": {"llm": "replay", "speed": 20.0}})
        events = list(job.events(timeout=240))
        result = job.result(timeout=10)
    kinds = {e.kind for e in events}
    assert {"job_started", "fork_started", "candidate", "verdict", "job_finished", "finished"} <= kinds
    assert result.status == "succeeded" and result.summary["mode"] == "specgen"
    verdicts = [(e.data["candidate_id"], e.data["stage"]) for e in events if e.kind == "verdict"]
    assert verdicts and len(verdicts) == len(set(verdicts))
