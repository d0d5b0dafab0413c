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


def test_engine_options_are_checked() -> None:
    from specgen.optimize.job import engine_from_options

    with pytest.raises(UsageError, match="must be one of"):
        engine_from_options({"engine": {"llm": "gpt"}}, "fused_elementwise")
    with pytest.raises(UsageError, match="unknown field `speeed`"):
        engine_from_options({"engine": {"llm": "replay", "speeed": 2}}, "fused_elementwise")
    with pytest.raises(UsageError, match="needs base_url, model, tokenizer"):
        engine_from_options({"engine": {"llm": "openai"}}, "fused_elementwise")
    with pytest.raises(UsageError, match="no bundled one"):
        engine_from_options({}, "softmax")
    engine = engine_from_options({"engine": {"speed": 4}}, "fused_elementwise")
    assert engine.name == "replay" and engine.speed == 4


def test_the_optimize_loop_runs_as_a_scheduler_job(tmp_path) -> None:
    """Submitted to a real local scheduler: its reasoner process runs the loop, its node's
    workers evaluate, the client sees the events and the result."""
    from specgen.runtime.local import LocalCluster
    from specgen.runtime.settings import RuntimeSettings
    from specgen.traces.bundled import bundled_problem

    settings = RuntimeSettings(eval_options={"trials": 2, "timing_trials": 5, "warmup": 1,
                                             "second_shape": False, "randomized_params": False})
    with LocalCluster(workers=2, settings=settings, state_dir=tmp_path / "state") as cluster:
        assert cluster.client is not None
        job = cluster.client.submit(
            bundled_problem("fused_elementwise"), entry="specgen.optimize.job:run_scheduled_job",
            max_iterations=1, options={"engine": {"llm": "replay", "speed": 16}})
        outcome = job.result(timeout=300)
        kinds = [event.kind for event in job.events(timeout=30)]
    assert outcome.status == "succeeded", outcome.error
    result = optimize_result(outcome)
    assert result.mode == "specgen" and result.metrics.forks > 0
    assert result.best_candidate_id == outcome.best_candidate_id is not None
    assert "fork_started" in kinds and "job_finished" in kinds
    workers = {c.validation.worker for c in result.candidates if c.validation is not None}
    assert workers and all(w.startswith("local0/") for w in workers)


def test_a_job_config_crosses_as_its_jobspec_and_comes_back_the_same() -> None:
    from specgen.messages import OptimizeSpec
    from specgen.optimize.engine_kinds import VllmSpec
    from specgen.optimize.job import ENTRY, JobConfig

    config = JobConfig(optimize=OptimizeSpec(job_id="j", problem_name="p", problem_source="s",
                                             time_budget_s=90, mode="sequential"),
                       engine=VllmSpec(model="/models/m", kv_pool="host"))
    job = config.to_job()
    assert job.entry == ENTRY and job.wall_time_s == 90.0 and job.options["engine"]["llm"] == "vllm"
    sent = msgspec.msgpack.decode(msgspec.msgpack.encode(job), type=JobSpec)   # as the wire carries it
    assert JobConfig.from_job(sent) == config
    sent.options["engine"]["kv_pol"] = "gpus"
    with pytest.raises(UsageError, match="unknown field `kv_pol`"):
        JobConfig.from_job(sent)
