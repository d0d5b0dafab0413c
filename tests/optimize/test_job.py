from __future__ import annotations

import msgspec
import pytest

from specgen.errors import UsageError
from specgen.messages import (
    JobProgress,
    JobSpec,
    OptimizeEvent,
    OptimizeResult,
    OptimizeSpec,
)
from specgen.optimize.job import (
    job_event,
    job_result,
    optimize_event,
    optimize_result,
    optimize_spec_from_job,
)


def test_scheduler_job_becomes_an_optimize_spec() -> None:
    job = JobSpec(job_id="j1", problem_name="p", problem_source="src", wall_time_s=60,
                  max_tokens=5000, max_iterations=3,
                  options={"mode": "pipeline", "target_speedup": 2.0,
                           "triggers": {"every_n_tokens": 128}})
    spec = optimize_spec_from_job(job)
    assert isinstance(spec, OptimizeSpec)
    assert (spec.job_id, spec.mode, spec.time_budget_s, spec.token_budget, spec.max_iterations) \
        == ("j1", "pipeline", 60.0, 5000, 3)
    assert spec.target_speedup == 2.0 and spec.triggers.every_n_tokens == 128


def test_bad_options_name_the_option() -> None:
    with pytest.raises(UsageError, match="unknown optimize option.*modee"):
        optimize_spec_from_job(JobSpec(job_id="j", problem_source="s", options={"modee": "x"}))
    with pytest.raises(UsageError, match="max_iterations"):
        optimize_spec_from_job(JobSpec(job_id="j", problem_source="s",
                                       options={"max_iterations": "three"}))


def test_events_and_results_survive_the_runtime_wire() -> None:
    event = OptimizeEvent(job_id="j", kind="fork_started", t=12.5, iteration=1,
                          request_id="j/it1/fork3", position=640, reason="cue: wait",
                          progress=JobProgress(forks=4, best_speedup=1.5))
    relayed = msgspec.msgpack.decode(msgspec.msgpack.encode(job_event(event)),
                                     type=type(job_event(event)))
    assert optimize_event(relayed) == event
    result = OptimizeResult(job_id="j", problem_name="p", mode="specgen",
                            status="time_budget", best_speedup=1.2)
    recorded = job_result(result)
    assert recorded.status == "timed_out"
    assert optimize_result(recorded) == result
    assert job_result(OptimizeResult(job_id="j", problem_name="p", mode="m",
                                     status="target_reached")).status == "succeeded"
