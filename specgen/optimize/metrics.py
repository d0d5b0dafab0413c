"""A job's figures, computed from its history once it ends.

Feedback latency is measured from the moment a candidate was extracted to the moment its verdict
was ready (the worker's finish time): the delay the optimize loop would see before it could act on
that candidate. Pool utilization is the evaluation workers' busy time over workers x the job's
wall time, counting only work done for this job.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence

from specgen.messages import (
    CandidateRecord,
    CandidateUpdate,
    ForkRecord,
    IterationRecord,
    JobMetrics,
)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation, None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _ready_at(update: CandidateUpdate, fallback: float | None) -> float | None:
    return update.finished_at if update.finished_at > 0 else fallback


def evaluation_updates(candidates: Sequence[CandidateRecord]) -> list[CandidateUpdate]:
    """Every stage update a job received, once each."""
    found: list[CandidateUpdate] = []
    for record in candidates:
        for update in (record.validation, record.profile):
            if update is not None and not any(update is seen for seen in found):
                found.append(update)
    return found


def compute_metrics(*, started_at: float, finished_at: float,
                    candidates: Sequence[CandidateRecord], forks: Sequence[ForkRecord],
                    iterations: Sequence[IterationRecord], reasoning_tokens: int,
                    fork_tokens: int, forks_skipped: int, workers_hint: int,
                    best: CandidateRecord | None) -> JobMetrics:
    end_to_end = max(0.0, finished_at - started_at)
    validation_feedback: list[float] = []
    profiling_feedback: list[float] = []
    validated = profiled = correct = cancelled = 0
    for record in candidates:
        if record.duplicate_of is not None:
            continue
        if record.status == "cancelled":
            cancelled += 1
        if record.status == "correct":
            correct += 1
        first = record.validation or record.profile
        if first is not None and not first.cancelled:
            validated += 1
            ready = _ready_at(first, record.feedback_at)
            if ready is not None:
                validation_feedback.append(max(0.0, ready - record.extracted_at))
        if record.profile is not None and not record.profile.cancelled:
            profiled += 1
            ready = _ready_at(record.profile, record.feedback_at)
            if ready is not None:
                profiling_feedback.append(max(0.0, ready - record.extracted_at))

    validation_busy = profiling_busy = 0.0
    workers: set[str] = set()
    for update in evaluation_updates(candidates):
        if update.started_at <= 0 or update.finished_at < update.started_at:
            continue
        span = update.finished_at - update.started_at
        if update.worker:
            workers.add(update.worker)
        if update.stage == "validate" or (update.stage == "full" and update.verdict.speedup is None):
            validation_busy += span
        else:
            profiling_busy += span
    worker_count = max(workers_hint, len(workers))
    utilization = None
    if worker_count and end_to_end > 0:
        utilization = (validation_busy + profiling_busy) / (worker_count * end_to_end)

    fork_prompt = sum(f.prompt_tokens or 0 for f in forks)
    fork_cached = sum(f.cached_tokens or 0 for f in forks)
    return JobMetrics(
        end_to_end_s=end_to_end,
        time_to_best_s=(best.feedback_at - started_at
                        if best is not None and best.feedback_at is not None else None),
        reasoning_tokens=reasoning_tokens,
        fork_tokens=fork_tokens,
        total_tokens=reasoning_tokens + fork_tokens,
        iterations=len(iterations),
        forks=len(forks),
        forks_skipped=forks_skipped,
        fork_cached_tokens=fork_cached,
        fork_prompt_tokens=fork_prompt,
        candidates=sum(1 for r in candidates if r.duplicate_of is None),
        duplicates=sum(1 for r in candidates if r.duplicate_of is not None),
        validated=validated,
        profiled=profiled,
        correct=correct,
        cancelled=cancelled,
        validation_busy_s=validation_busy,
        profiling_busy_s=profiling_busy,
        workers=worker_count,
        pool_utilization=utilization,
        validation_feedback_s=validation_feedback,
        profiling_feedback_s=profiling_feedback,
        feedback_p50_s=percentile(profiling_feedback, 50),
        feedback_p95_s=percentile(profiling_feedback, 95),
    )


def mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None
