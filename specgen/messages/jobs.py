"""A job as the scheduler holds it: its spec, the events of its progress, how it ended, and its
status; the optimize loop's job (messages/optimize.py) travels inside them as builtins."""
from __future__ import annotations

from typing import Any, Literal

import msgspec

from specgen.messages.evaluation import Verdict

# How a job ended, as the scheduler records it (`JobResult.status`; also the keys of
# SchedulerStats.jobs_by_state besides "running"). "timed_out": its wall time ran out.
JobOutcome = Literal["succeeded", "failed", "cancelled", "timed_out"]

# Where a job is (`JobStatus.state`): its result is set once it is "finished".
JobRunState = Literal["running", "finished"]


class JobSpec(msgspec.Struct, kw_only=True):
    """A job: a problem to optimize, budgets, and the code that runs its optimize loop."""

    job_id: str = ""                        # empty: the scheduler assigns one
    problem_name: str = ""                  # for logs and caches
    problem_source: str = ""                # KernelBench-format reference program
    entry: str = ""                         # "module:function" run by the job's reasoner; "" = default
    wall_time_s: float | None = None        # stop the job after this long (the scheduler enforces it)
    max_tokens: int | None = None           # token budget, enforced by the optimize loop
    max_iterations: int | None = None       # iteration budget, enforced by the optimize loop
    options: dict[str, Any] = {}            # entry-specific settings (msgpack builtins only)
    created_at: float = 0.0                 # wall clock, set by the scheduler
    deadline: float | None = None           # created_at + wall_time_s, set by the scheduler


class JobEvent(msgspec.Struct, kw_only=True):
    """One step of a job's progress (iteration started, candidate verdict, best so far, ...)."""

    job_id: str
    seq: int = 0                            # 1, 2, ... per job, assigned by the scheduler
    kind: str                               # e.g. "started", "candidate", "best", "log", "finished"
    t: float = 0.0                          # wall clock when it happened
    data: dict[str, Any] = {}               # kind-specific details (msgpack builtins only)


class JobResult(msgspec.Struct, kw_only=True):
    """How a job ended."""

    job_id: str
    status: JobOutcome
    best_candidate_id: str | None = None    # best correct candidate, if any
    best_verdict: Verdict | None = None     # its verdict
    summary: dict[str, Any] = {}            # entry-specific totals (iterations, tokens, ...)
    error: str | None = None                # why it failed, else None
    finished_at: float = 0.0                # wall clock


class JobStatus(msgspec.Struct, kw_only=True):
    """A job as the scheduler sees it now."""

    spec: JobSpec
    state: JobRunState
    attempts: int = 0                       # reasoner starts (more than 1 after a scheduler restart)
    candidates: int = 0                     # candidates accepted for the job
    updates: int = 0                        # stage verdicts recorded for the job
    last_event_seq: int = 0                 # seq of its latest JobEvent
    result: JobResult | None = None         # set once finished
