"""Between the runtime's job messages and the optimize loop's own types.

The scheduler knows a job as a `JobSpec` (problem, wall time, token and iteration budgets, and an
`options` dict for the code that runs it); the optimize loop wants an `OptimizeSpec`. The reasoner
actor that hosts a job converts the spec on the way in, and the loop's events and result on the
way out (`JobEvent.data` and `JobResult.summary` hold them as msgpack builtins, so a client can
turn them back into typed structs with `msgspec.convert`).

`JobConfig` is the job typed: its `OptimizeSpec` and its engine's `EngineSpec`
(optimize/engine_kinds.py). `to_job` makes the `JobSpec` a scheduler carries, `from_job` takes it
back, strictly (an unknown option is an error that names it).

`run_scheduled_job` is the entry a scheduler job names to run the optimize loop in its reasoner
(`JobSpec.entry = "specgen.optimize.job:run_scheduled_job"`): `options` holds OptimizeSpec fields
plus `engine`, which says what to generate with:

    {"llm": "replay", "trace": PATH, "speed": 1.0,       (no trace: the problem's bundled one)
     "fork_model": "draft", "timing": ["r1=40"]}         (default scripted: the trace's own forks)
    {"llm": "vllm", "model": DIR, "tokenizer": DIR,
     "kv_pool": "auto", "kv_pool_gib": 4.0}             (the remote KV pool: kv/engine_config.py)
    {"llm": "openai", "base_url": URL, "model": NAME, "tokenizer": DIR}
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from specgen.errors import UsageError
from specgen.messages import (
    JobEvent, JobOutcome, JobResult, JobSpec, OptimizeEvent, OptimizeResult, OptimizeSpec, OptimizeStatus,
)

from specgen.optimize.engine_kinds import EngineSpec

if TYPE_CHECKING:
    from specgen.engines.base import Engine
    from specgen.backend import EvaluationBackend

ENGINE_OPTION = "engine"
ENTRY = "specgen.optimize.job:run_scheduled_job"
# Events the scheduler itself adds to a job's stream (the rest are the loop's OptimizeEvents).
SCHEDULER_EVENTS = ("created", "reasoner_started", "resumed", "verdict", "finished")
# A line for the run's notice from the job's reasoner (where its KV pool went), not a loop event.
NOTICE_EVENT = "notice"

# How an optimize job's end reads to the scheduler.
_RUNTIME_STATUS: dict[OptimizeStatus, JobOutcome] = {
    "target_reached": "succeeded",
    "iterations_done": "succeeded",
    "token_budget": "succeeded",
    "time_budget": "timed_out",
    "cancelled": "cancelled",
    "failed": "failed",
}


def optimize_spec_from_job(job: JobSpec) -> OptimizeSpec:
    """The OptimizeSpec a scheduler job describes: its budgets plus `options` (OptimizeSpec fields).

    Unknown option names or wrongly typed values raise UsageError naming the option.
    """
    fields: dict[str, Any] = dict(job.options)
    fields.pop(ENGINE_OPTION, None)
    fields["job_id"] = job.job_id
    fields["problem_name"] = job.problem_name
    fields["problem_source"] = job.problem_source
    if job.wall_time_s is not None:
        fields.setdefault("time_budget_s", job.wall_time_s)
    if job.max_tokens is not None:
        fields.setdefault("token_budget", job.max_tokens)
    if job.max_iterations is not None:
        fields.setdefault("max_iterations", job.max_iterations)
    known = set(OptimizeSpec.__struct_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise UsageError(f"job {job.job_id!r}: unknown optimize option(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(known))}")
    try:
        return msgspec.convert(fields, OptimizeSpec)
    except msgspec.ValidationError as exc:
        raise UsageError(f"job {job.job_id!r}: bad optimize option: {exc}") from None


class JobConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One optimize job, typed: what the loop does (`optimize`) and what it generates with
    (`engine`). Built once where the job starts (`specgen optimize`: `commands.job_config`), it
    crosses processes as the scheduler's `JobSpec` (`to_job`) and is decoded back, strictly, in the
    job's reasoner (`from_job`). How candidates are evaluated is the cluster's (its workers'
    `eval_options` setting), not one job's: a cluster's workers serve every job alike."""

    optimize: OptimizeSpec
    engine: EngineSpec

    def to_job(self) -> JobSpec:
        spec = self.optimize
        options = msgspec.to_builtins(spec)
        # What the JobSpec carries in fields of its own is not repeated in the options: the job's
        # wall time is one value, `wall_time_s`, which the loop reads as its time budget.
        for key in ("job_id", "problem_name", "problem_source", "time_budget_s"):
            options.pop(key, None)
        options[ENGINE_OPTION] = msgspec.to_builtins(self.engine)
        # The loop ends itself at its time budget; the scheduler's deadline (plus job_grace_s)
        # stops a job whose reasoner does not.
        return JobSpec(job_id=spec.job_id, problem_name=spec.problem_name, problem_source=spec.problem_source,
                       entry=ENTRY, options=options, wall_time_s=spec.time_budget_s)

    @classmethod
    def from_job(cls, job: JobSpec) -> "JobConfig":
        """The config a scheduler job carries; an unknown or wrongly typed option is a UsageError
        that names it."""
        from specgen.optimize.engine_kinds import engine_spec

        return cls(optimize=optimize_spec_from_job(job),
                   engine=engine_spec(job.options.get(ENGINE_OPTION) or {}, where=f"options[{ENGINE_OPTION!r}]"))


def job_event(event: OptimizeEvent) -> JobEvent:
    """A loop event as the scheduler journals and relays it."""
    data = msgspec.to_builtins(event)
    for key in ("job_id", "kind", "t"):
        data.pop(key, None)
    return JobEvent(job_id=event.job_id, kind=event.kind, t=event.t, data=data)


def optimize_event(event: JobEvent) -> OptimizeEvent:
    """Back from the relayed form (for clients)."""
    return msgspec.convert({**event.data, "job_id": event.job_id, "kind": event.kind,
                            "t": event.t}, OptimizeEvent)


def job_result(result: OptimizeResult) -> JobResult:
    """The loop's result as the scheduler records it; `summary` holds the whole OptimizeResult."""
    return JobResult(job_id=result.job_id, status=_RUNTIME_STATUS.get(result.status, "failed"),
                     best_candidate_id=result.best_candidate_id, best_verdict=result.best_verdict,
                     summary=msgspec.to_builtins(result), error=result.error,
                     finished_at=result.finished_at)


def optimize_result(result: JobResult) -> OptimizeResult:
    """Back from the recorded form (for clients)."""
    return msgspec.convert(result.summary, OptimizeResult)


def engine_from_options(options: dict[str, Any], problem_name: str) -> Engine:
    """The engine a scheduler job's `options["engine"]` describes (see the module docstring;
    checked and built by the registry in `engine_kinds`)."""
    from specgen.optimize.engine_kinds import build_engine

    return build_engine(options.get(ENGINE_OPTION) or {}, problem_name,
                        where=f"options[{ENGINE_OPTION!r}]")


async def run_scheduled_job(job: JobSpec, backend: EvaluationBackend,
                            emit: Callable[[JobEvent], None], run_dir: Path | None = None) -> JobResult:
    """The optimize loop as a scheduler job's entry (runs inside the job's reasoner process).

    With `run_dir` (the job's folder, which outlives its reasoner) the loop journals there, and a
    reasoner started again continues from that journal: completed iterations stand, the one in
    progress runs again from its start, no candidate is evaluated twice (`--resume`'s mechanism).
    A vLLM engine keeps its KV blocks in the remote pool, as `specgen optimize` does in its own
    process: where `options["engine"]["kv_pool"]` (default auto) puts it on this machine."""
    import asyncio
    import logging
    import time

    from specgen.optimize import kv_pool
    from specgen.optimize.loop import run_job
    from specgen.optimize.outputs import LoopJournal, ResumedRun

    from specgen.optimize.engine_kinds import VllmSpec, build_engine

    config = JobConfig.from_job(job)
    spec, described = config.optimize, config.engine
    engine = build_engine(described, job.problem_name)
    pool_id = ""
    journal = resume = None
    if run_dir is not None:
        earlier = ResumedRun.read(run_dir)
        resume = earlier if (earlier.candidates or earlier.iterations) else None
        journal = LoopJournal(run_dir)
    try:
        if isinstance(described, VllmSpec):
            notice, pool_id = await asyncio.to_thread(
                kv_pool.attach_in_cluster, engine, backend, described.kv_pool, described.kv_pool_gib)
            logging.getLogger("specgen.optimize.job").info("job %s: %s", job.job_id, notice)
            emit(JobEvent(job_id=job.job_id, kind=NOTICE_EVENT, t=time.time(), data={"text": notice}))
        result = await run_job(spec, engine, backend, lambda event: emit(job_event(event)),
                               journal=journal, resume=resume)
        if pool_id:
            result.kv_pool = await asyncio.to_thread(kv_pool.final_stats, backend, pool_id, settle_s=0.3)
    finally:
        if journal is not None:
            journal.close()
        await engine.close()
    return job_result(result)
