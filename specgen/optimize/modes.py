"""The four ways a job can run, and which speculation mechanisms each one uses.

- `specgen`: forks at trigger points while the reasoning runs, inline code-block candidates,
  load-aware triggers, early termination; each switchable alone for ablations (`OptimizeSpec`).
- `sequential`: reason to the end, extract the final kernel, validate, profile, feed back, repeat.
- `best-of-n`: n independent reasoning streams per iteration, each evaluated when it ends; the next
  iteration starts once all n are evaluated.
- `pipeline`: generation and evaluation decoupled: the next iteration starts as soon as the
  reasoning ends, from the feedback available then, while earlier candidates are still evaluated.

Elastic pools are a runtime setting (the scheduler's), recorded here so a job states what it ran on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from specgen.errors import UsageError
from specgen.messages import OptimizeMode, OptimizeSpec

# Read from OptimizeSpec.mode's type, so the CLI's choices and what a job's message may carry are
# one list: a mode added there is offered here, and no other is decoded.
MODES: tuple[OptimizeMode, ...] = get_args(OptimizeMode)


@dataclass(frozen=True)
class Mechanisms:
    forking: bool
    early_termination: bool
    inline_candidates: bool
    load_aware: bool
    elastic_pools: bool

    @classmethod
    def of(cls, spec: OptimizeSpec) -> Mechanisms:
        if spec.mode == "specgen":
            return cls(spec.forking, spec.early_termination, spec.inline_candidates,
                       spec.load_aware, spec.elastic_pools)
        # The baselines use none of them: static pools, no forks, run every reasoning to its end.
        return cls(False, False, False, False, False)

    def describe(self) -> str:
        on = [name for name, value in vars(self).items() if value]
        return ", ".join(on) if on else "none"


def check_spec(spec: OptimizeSpec) -> None:
    """Reject settings no job can run with, naming the setting to fix."""
    if spec.mode not in MODES:
        raise UsageError(f"unknown mode {spec.mode!r}; choose one of {', '.join(MODES)}")
    if not spec.problem_source.strip():
        raise UsageError(f"job {spec.job_id!r} has an empty problem_source")
    if spec.max_iterations < 1:
        raise UsageError(f"max_iterations must be >= 1, got {spec.max_iterations}")
    if spec.time_budget_s is not None and spec.time_budget_s <= 0:
        raise UsageError(f"time budget must be > 0 seconds, got {spec.time_budget_s}")
    if spec.token_budget is not None and spec.token_budget <= 0:
        raise UsageError(f"token budget must be > 0, got {spec.token_budget}")
    if spec.target_speedup is not None and spec.target_speedup <= 0:
        raise UsageError(f"target speedup must be > 0, got {spec.target_speedup}")
    if spec.improvement_margin is not None and spec.improvement_margin < 0:
        raise UsageError(f"improvement margin must be >= 0, got {spec.improvement_margin}")
    if spec.mode == "best-of-n" and spec.best_of_n < 1:
        raise UsageError(f"best_of_n must be >= 1, got {spec.best_of_n}")
    if spec.reasoning_max_tokens < 1 or spec.fork_max_tokens < 1:
        raise UsageError("reasoning_max_tokens and fork_max_tokens must be >= 1")
    if spec.verdict_timeout_s <= 0:
        raise UsageError(f"verdict_timeout_s must be > 0, got {spec.verdict_timeout_s}")
    triggers = spec.triggers
    if triggers.every_n_tokens < 0 or triggers.min_gap_tokens < 0:
        raise UsageError("trigger every_n_tokens and min_gap_tokens must be >= 0")
    if triggers.max_forks_per_iteration < 0 or triggers.max_forks_in_flight < 0:
        raise UsageError("trigger max_forks_per_iteration and max_forks_in_flight must be >= 0")
