"""When to stop: pluggable termination criteria, asked on every profiling verdict.

A criterion answers with a `Termination` of one of two scopes:
- "job": the job has what it wants (e.g. a correct kernel at or above the target speedup); stop
  everything: the reasoning, every fork, every evaluation still queued or running.
- "iteration": this iteration has produced something worth feeding back now (e.g. a candidate that
  beats every kernel found before it by a margin); abort its reasoning and forks and start the
  next iteration with that feedback. Evaluations already in flight continue.

"Before it" is in the order candidates were found, not the order verdicts arrive: the loop asks
again about a candidate when an earlier one's verdict comes in late, so a fast kernel whose
verdict overtook a slow earlier one's is still recognized as the improvement it is. Before any
kernel has a verdict the bar is the reference itself (1.0x); after that it is the best kernel so
far, which also makes the rule meaningful where every kernel is slower than the reference (Triton
under the CPU interpreter).

With early termination on, the loop asks while generation is still running; with it off (and in the
baselines), only once an iteration's reasoning has ended and its candidates are evaluated.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass
class VerdictView:
    """One evaluated candidate, as a criterion sees it."""

    candidate_id: str
    correct: bool
    speedup: float | None                  # None when it was not profiled


@dataclass
class JobStanding:
    """The job's state as a criterion sees it, for one candidate."""

    iteration: int
    best_speedup: float | None             # best correct speedup so far, every verdict included
    bar: float                             # best correct speedup among kernels found before this
                                           # candidate; the reference (1.0) when there is none


@dataclass
class Termination:
    scope: str                             # "job" | "iteration"
    reason: str


class TerminationCriterion(Protocol):
    def check(self, verdict: VerdictView, standing: JobStanding) -> Termination | None:
        """Stop now (and how far), or None to go on."""


class TargetSpeedup:
    """The job is done once a correct candidate reaches `target` times the reference's speed."""

    def __init__(self, target: float) -> None:
        if target <= 0:
            raise ValueError(f"target speedup must be > 0, got {target}")
        self.target = target

    def check(self, verdict: VerdictView, standing: JobStanding) -> Termination | None:
        if verdict.correct and verdict.speedup is not None and verdict.speedup >= self.target:
            return Termination(
                "job", f"{verdict.candidate_id} reached {verdict.speedup:.3g}x "
                       f"(target {self.target:.3g}x)")
        return None


class BeatsEarlier:
    """The iteration has news once a correct candidate beats the kernels found before it by
    `margin` (relative: 0.1 means 10% faster than the best of them, or than the reference when
    none of them has a verdict)."""

    def __init__(self, margin: float) -> None:
        if margin < 0:
            raise ValueError(f"improvement margin must be >= 0, got {margin}")
        self.margin = margin

    def check(self, verdict: VerdictView, standing: JobStanding) -> Termination | None:
        bar = standing.bar * (1.0 + self.margin)
        if verdict.correct and verdict.speedup is not None and verdict.speedup >= bar:
            return Termination(
                "iteration", f"{verdict.candidate_id} at {verdict.speedup:.3g}x beats "
                             f"{standing.bar:.3g}x by >= {self.margin:.0%}")
        return None


class FirstOf:
    """Several criteria; a job-scope answer wins over an iteration-scope one."""

    def __init__(self, criteria: Sequence[TerminationCriterion]) -> None:
        self.criteria = list(criteria)

    def check(self, verdict: VerdictView, standing: JobStanding) -> Termination | None:
        found = [t for c in self.criteria if (t := c.check(verdict, standing)) is not None]
        for termination in found:
            if termination.scope == "job":
                return termination
        return found[0] if found else None


def default_criterion(target_speedup: float | None, margin: float | None) -> FirstOf:
    """Correct and at/above the target ends the job; beating the kernels found before by a margin
    ends the iteration. Either part is left out when its setting is None."""
    criteria: list[TerminationCriterion] = []
    if target_speedup is not None:
        criteria.append(TargetSpeedup(target_speedup))
    if margin is not None:
        criteria.append(BeatsEarlier(margin))
    return FirstOf(criteria)
