"""A job of the optimize loop (specgen/optimize/loop.py): its specification, the events it emits
while it runs, and its result with full history.

The runtime's JobSpec/JobEvent/JobResult (messages/jobs.py) wrap them: a scheduler job's `options`
hold an OptimizeSpec's fields, its events' and result's `data` and `summary` hold these as builtins
(specgen/optimize/job.py converts both ways).
"""
from __future__ import annotations

from typing import Literal

import msgspec

from specgen.messages.evaluation import CandidateOrigin, CandidateUpdate, Verdict
from specgen.messages.kv import KvPoolStats

# The four ways a job can run (specgen/optimize/modes.py, whose MODES is read from this).
OptimizeMode = Literal["specgen", "sequential", "best-of-n", "pipeline"]

# How a job ended (specgen/optimize/job_end.py: the first stop wins). The scheduler's JobResult
# reads it as a JobOutcome (specgen/optimize/job.py).
OptimizeStatus = Literal["target_reached", "iterations_done", "time_budget", "token_budget",
                         "cancelled", "failed"]

# Where a candidate stands: "pending" until its final verdict; "duplicate" when an equivalent
# program came first (not evaluated); "lost" when it could not be submitted or its verdict never
# came; "cancelled" when the job stopped waiting for it.
CandidateStatus = Literal["pending", "failed", "incorrect", "correct", "cancelled", "duplicate", "lost"]

# What a fork gave: "running" until it ends; "no_code" when it ended without a program.
ForkOutcome = Literal["running", "candidate", "duplicate", "no_code", "aborted", "error"]


class TriggerSettings(msgspec.Struct, kw_only=True):
    """Where a job may fork and which gates may veto a fork (specgen/optimize/triggers.py)."""

    every_n_tokens: int = 0                 # fork each time the reasoning passes a multiple; 0 = off
    structure_boundaries: bool = True       # paragraph breaks, headings, numbered steps
    cues: list[str] | None = None           # decision cues ("let me write", "wait"); None or [] = off
    min_gap_tokens: int = 320               # no fork closer than this to the previous one (or the start)
    max_forks_per_iteration: int = 10
    max_forks_in_flight: int = 2            # 0 = no limit
    queue_saturation: float = 2.0           # load-aware: skip when a queue holds this many per worker
    barren_forks: int = 2                   # load-aware: this many forks in a row gave nothing new...
    barren_backoff_tokens: int = 768        # ...then wait this many reasoning tokens before the next


class OptimizeSpec(msgspec.Struct, kw_only=True):
    """One optimize job: a problem, a mode, budgets, and the speculation switches."""

    job_id: str
    problem_name: str
    problem_source: str                     # KernelBench-format reference program
    mode: OptimizeMode = "specgen"
    time_budget_s: float | None = None      # wall time for the whole job; None = no limit
    token_budget: int | None = None         # reasoning + fork tokens for the whole job; None = no limit
    max_iterations: int = 4
    target_speedup: float | None = None     # a correct kernel this fast ends the job; None = no target
    improvement_margin: float | None = 0.1  # beating the iteration's baseline by this ends an iteration
    reasoning_max_tokens: int = 32768
    fork_max_tokens: int = 4096
    temperature: float = 0.6
    top_p: float = 0.95
    seed: int | None = None
    best_of_n: int = 4                      # reasoning streams per iteration in "best-of-n"
    verdict_timeout_s: float = 900.0        # longest wait for one candidate's verdict
    # After the last iteration, also wait for speculative (fork, inline) candidates still owed a
    # verdict instead of cancelling them: they may hold a better kernel, at the cost of their queue.
    drain_speculative: bool = False
    # Speculation mechanisms, used in "specgen" mode; each can be switched off alone (ablations).
    forking: bool = True                    # fork non-reasoning generations at trigger points
    early_termination: bool = True          # abort generation as soon as the criterion is met
    inline_candidates: bool = True          # code blocks finished inside the reasoning are candidates
    load_aware: bool = True                 # skip forks while evaluation queues are saturated
    elastic_pools: bool = True              # a runtime setting: the scheduler moves GPUs between pools
    triggers: TriggerSettings = msgspec.field(default_factory=TriggerSettings)


class JobProgress(msgspec.Struct, kw_only=True):
    """A snapshot of a running job, carried by every event (the progress display reads it)."""

    elapsed_s: float = 0.0
    iteration: int = 0
    reasoning_tokens: int = 0               # all iterations
    fork_tokens: int = 0
    forks: int = 0                          # forks started
    forks_running: int = 0
    candidates: int = 0                     # distinct candidates submitted
    validating: int = 0                     # submitted, no validation verdict yet
    profiling: int = 0                      # validated, no profiling verdict yet
    profiled: int = 0
    best_speedup: float | None = None


class OptimizeEvent(msgspec.Struct, kw_only=True):
    """Something happened in a job. `kind` says what; the fields that apply are set."""

    job_id: str
    kind: str                               # job_started | iteration_started | reasoning_finished |
                                            # fork_started | fork_skipped | fork_finished | candidate |
                                            # duplicate | update | termination | iteration_finished |
                                            # job_finished | error
    t: float                                # wall clock (time.time())
    iteration: int = 0
    request_id: str = ""                    # reasoning or fork request it concerns
    candidate_id: str = ""
    origin: Literal["", CandidateOrigin] = ""   # the candidate's, for candidate events ("" otherwise)
    position: int | None = None             # reasoning tokens at that moment
    reason: str = ""                        # trigger, veto, termination or finish reason
    update: CandidateUpdate | None = None   # for kind "update"
    progress: JobProgress | None = None


class ForkRecord(msgspec.Struct, kw_only=True):
    """One fork taken by a job."""

    request_id: str
    iteration: int
    position: int                           # reasoning tokens it was forked from
    trigger: str                            # which trigger fired, and what it saw
    started_at: float
    finished_at: float | None = None
    tokens: int = 0                         # tokens it generated
    prompt_tokens: int | None = None        # as the engine saw the prompt
    cached_tokens: int | None = None        # prompt tokens served from the prefix cache
    finish_reason: str | None = None        # "stop" | "length" | "abort" | "error"
    outcome: ForkOutcome = "running"
    candidate_id: str = ""


class CandidateRecord(msgspec.Struct, kw_only=True):
    """One candidate program a job found, and what its evaluation said."""

    candidate_id: str
    iteration: int
    origin: CandidateOrigin
    request_id: str                         # the generation it came from
    position: int                           # reasoning tokens when it was found
    fingerprint: str                        # hash of the normalized source (dedup key)
    source: str
    extracted_at: float
    duplicate_of: str | None = None         # set when an equivalent program came first: not evaluated
    status: CandidateStatus = "pending"
    validation: CandidateUpdate | None = None
    profile: CandidateUpdate | None = None  # also set for a single "full" update
    feedback_at: float | None = None        # when its final verdict arrived

    @property
    def speedup(self) -> float | None:
        final = self.profile or self.validation
        if final is None or not final.verdict.correct:
            return None
        return final.verdict.speedup


class ReasoningRecord(msgspec.Struct, kw_only=True):
    """One reasoning stream (an iteration has one, or n in best-of-n)."""

    request_id: str
    iteration: int
    started_at: float
    finished_at: float | None = None
    tokens: int = 0
    finish_reason: str | None = None        # "stop" | "length" | "abort" | "error"


class IterationRecord(msgspec.Struct, kw_only=True):
    index: int
    started_at: float
    finished_at: float | None = None
    request_ids: list[str] = []             # its reasoning streams (several in best-of-n)
    prompt_tokens: int = 0
    reasoning_tokens: int = 0
    reasoning_finished_at: float | None = None
    finish_reason: str | None = None        # the reasoning's: "stop" | "length" | "abort" | "error"
    stop_reason: str = ""                   # why the iteration ended
    baseline_speedup: float = 1.0           # best correct speedup when it began (1.0: none yet)
    prompt: str = ""                        # the user message it was given (with feedback)


class JobMetrics(msgspec.Struct, kw_only=True):
    end_to_end_s: float = 0.0
    time_to_best_s: float | None = None     # job start -> the best kernel's profiling verdict
    reasoning_tokens: int = 0
    fork_tokens: int = 0
    total_tokens: int = 0
    iterations: int = 0
    forks: int = 0
    forks_skipped: int = 0                  # trigger points vetoed by a gate
    fork_cached_tokens: int = 0             # prompt tokens forks got from the prefix cache
    fork_prompt_tokens: int = 0
    candidates: int = 0                     # distinct candidates submitted
    duplicates: int = 0                     # found again, not re-evaluated
    validated: int = 0                      # validation verdicts received
    profiled: int = 0                       # profiling verdicts received (profiling feedback)
    correct: int = 0
    cancelled: int = 0
    validation_busy_s: float = 0.0          # summed over workers
    profiling_busy_s: float = 0.0
    workers: int = 0                        # evaluation workers seen by the job
    pool_utilization: float | None = None   # busy time / (workers x end-to-end time)
    validation_feedback_s: list[float] = [] # extracted -> validation verdict, per candidate
    profiling_feedback_s: list[float] = []  # extracted -> profiling verdict, per candidate
    feedback_p50_s: float | None = None     # of profiling feedback latency
    feedback_p95_s: float | None = None


class OptimizeResult(msgspec.Struct, kw_only=True):
    """What a job found, how, and at what cost."""

    job_id: str
    problem_name: str
    mode: OptimizeMode
    status: OptimizeStatus
    stop_reason: str = ""
    engine: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    best_candidate_id: str | None = None
    best_speedup: float | None = None
    best_source: str | None = None
    best_verdict: Verdict | None = None
    cpu_timing: bool = True                 # the best kernel's timing is a CPU timing
    spec: OptimizeSpec | None = None
    iterations: list[IterationRecord] = []
    reasoning: list[ReasoningRecord] = []
    forks: list[ForkRecord] = []
    candidates: list[CandidateRecord] = []
    metrics: JobMetrics = msgspec.field(default_factory=JobMetrics)
    error: str | None = None
    kv_pool: KvPoolStats | None = None      # the job's remote KV pool at its end (None: no pool)
