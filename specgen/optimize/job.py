"""Between the runtime's job messages and the optimize loop's own types.

The scheduler knows a job as a `JobSpec` (problem, wall time, token and iteration budgets, and an
`options` dict for the code that runs it); the optimize loop wants an `OptimizeSpec`. The reasoner
actor that hosts a job converts the spec on the way in, and the loop's events and result on the
way out (`JobEvent.data` and `JobResult.summary` hold them as msgpack builtins, so a client can
turn them back into typed structs with `msgspec.convert`).
"""
from __future__ import annotations

from typing import Any

import msgspec

from specgen.errors import UsageError
from specgen.messages import JobEvent, JobResult, JobSpec, OptimizeEvent, OptimizeResult, OptimizeSpec

# How an optimize job's end reads to the scheduler.
_RUNTIME_STATUS = {
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
