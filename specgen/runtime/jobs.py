"""Built-in job entry points a reasoner can run (JobSpec.entry = "specgen.runtime.jobs:NAME").

`evaluate_candidates` evaluates a given set of candidate programs for the job's problem through
the scheduler and reports the fastest correct one: batch evaluation of kernels written elsewhere,
and the smallest real job for exercising the job machinery (restart, cancel, budgets). The
optimize loop's own entry lives in specgen.optimize.
"""
from __future__ import annotations

import asyncio
from typing import Callable

from specgen.clock import SYSTEM_CLOCK, Clock
from specgen.errors import UsageError
from specgen.messages import CandidateSubmission, CandidateUpdate, JobEvent, JobResult, JobSpec
from specgen.backend import EvaluationBackend


def _candidates(spec: JobSpec) -> list[tuple[str, str]]:
    raw = spec.options.get("candidates")
    if isinstance(raw, dict) and raw:
        return [(str(k), str(v)) for k, v in raw.items()]
    if isinstance(raw, list) and raw:
        return [(f"c{i}", str(v)) for i, v in enumerate(raw)]
    raise UsageError("evaluate_candidates needs options['candidates']: a non-empty {id: source} or [source]")


async def evaluate_candidates(
    spec: JobSpec, backend: EvaluationBackend, emit: Callable[[JobEvent], None],
    *, clock: Clock = SYSTEM_CLOCK,
) -> JobResult:
    """Options: candidates ({id: source} or [source]); profile (default True); target_speedup
    (stop once a correct candidate is at least this fast); submit_interval_s (spread submissions
    over time, as forks would arrive, on `clock`)."""
    candidates = _candidates(spec)
    profile = bool(spec.options.get("profile", True))
    target = spec.options.get("target_speedup")
    interval = float(spec.options.get("submit_interval_s", 0.0))
    pending = {cid for cid, _ in candidates}
    best: CandidateUpdate | None = None
    counts = {"validated": 0, "correct": 0, "profiled": 0, "cancelled": 0}
    stopped_early = False

    async def submit_all() -> None:
        for i, (cid, source) in enumerate(candidates):
            if i and interval:
                await clock.sleep(interval)
            await backend.submit(CandidateSubmission(
                job_id=spec.job_id, candidate_id=cid, problem_name=spec.problem_name,
                problem_source=spec.problem_source, candidate_source=source, origin="final",
                iteration=0, extracted_at=clock.wall(), deadline=spec.deadline, profile=profile))
        emit(JobEvent(job_id=spec.job_id, kind="submitted", data={"candidates": len(candidates)}))

    submitter = asyncio.ensure_future(submit_all())
    updates = backend.updates().__aiter__()
    next_update: asyncio.Future | None = None
    try:
        while pending:
            if next_update is None:
                next_update = asyncio.ensure_future(updates.__anext__())
            waits = {next_update} if submitter.done() else {next_update, submitter}
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if submitter in done and submitter.exception() is not None:
                raise submitter.exception()  # type: ignore[misc]
            if next_update not in done:
                continue
            upd: CandidateUpdate = next_update.result()
            next_update = None
            if upd.job_id != spec.job_id or upd.candidate_id not in pending:
                continue
            v = upd.verdict
            if upd.cancelled:
                counts["cancelled"] += 1
                pending.discard(upd.candidate_id)
            elif upd.stage == "validate":
                counts["validated"] += 1
                counts["correct"] += int(v.correct)
                if not (v.correct and profile):
                    pending.discard(upd.candidate_id)
            else:
                counts["profiled"] += 1
                pending.discard(upd.candidate_id)
                if v.correct and v.speedup is not None and (
                        best is None or v.speedup > (best.verdict.speedup or 0.0)):
                    best = upd
                    emit(JobEvent(job_id=spec.job_id, kind="best",
                                  data={"candidate_id": upd.candidate_id, "speedup": v.speedup}))
                    if target is not None and v.speedup >= float(target):
                        stopped_early = True
                        break
    finally:
        for task in (submitter, next_update):
            if task is not None and not task.done():
                task.cancel()
    if stopped_early:
        await backend.cancel_job(spec.job_id)
    return JobResult(
        job_id=spec.job_id, status="succeeded",
        best_candidate_id=best.candidate_id if best else None,
        best_verdict=best.verdict if best else None,
        summary={"candidates": len(candidates), **counts, "stopped_early": stopped_early},
    )
