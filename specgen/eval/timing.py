"""Summaries of the judge's timed calls (eval/profiling.py measures them; docs/evaluation.md says how).

A timed call is three windows on the judge's clock (`Windows`): making the inputs, the call, the
digest, each ended by a message whose arrival the kernel stamps. A call's own time is its call
window, plus whatever its other two windows took beyond the reference's medians of them, less
the call window of a call of nothing (`Allowance.net`): the runner that sends the messages decides
where one window ends and the next begins, and this way moving work out of the call window gains
it no more than the reference's windows' spread. The median of those times is the verdict's time;
the spread is (p75 - p25) / median.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

MIN_MS = 1e-3                   # 1 us: no finer time is claimed, whatever the overhead's spread


@dataclass(frozen=True)
class Windows:
    """One timed trial, ms: request to "made", "made" to "called", "called" to the reply."""

    made: float
    call: float
    digest: float


@dataclass(frozen=True)
class Allowance:
    """What is taken off a timed call's windows, from the reference's own timing."""

    made_ms: float              # the most taken off its window of making the inputs
    digest_ms: float            # the most taken off its digest's window
    overhead_ms: float          # always taken off: a call of nothing's call window (median)

    @classmethod
    def of(cls, calls: Sequence[Windows], nothing: Sequence[Windows]) -> Allowance:
        """From a model's timed calls and the calls of nothing between them."""
        return cls(made_ms=statistics.median(w.made for w in calls),
                   digest_ms=statistics.median(w.digest for w in calls),
                   overhead_ms=statistics.median(w.call for w in nothing))

    def excess(self, windows: Windows) -> float:
        """What the call's windows of inputs and digest took beyond the allowance: charged."""
        return max(0.0, windows.made - self.made_ms) + max(0.0, windows.digest - self.digest_ms)

    def net(self, windows: Windows) -> float:
        """The call's own time."""
        return windows.call + self.excess(windows) - self.overhead_ms

    def taken_off(self, windows: Windows) -> float:
        """What `net` took off the trial's whole time."""
        return windows.made + windows.call + windows.digest - self.net(windows)

    @staticmethod
    def resolution(calls: Sequence[Windows], nothing: Sequence[Windows]) -> float:
        """No finer time is claimed: the spread (p75 - p25) of a call of nothing's call window,
        plus how far the reference's windows of inputs and digest fall below their medians
        (p50 - p25): about what a process that times its stage messages could move out of
        the call window (an honest call's excess only adds to its time)."""
        def below(values: list[float]) -> float:
            stats = summarize(values)
            return stats.median_ms - stats.p25_ms

        empty = summarize([w.call for w in nothing])
        return max(empty.p75_ms - empty.p25_ms + below([w.made for w in calls])
                   + below([w.digest for w in calls]), MIN_MS)


@dataclass
class TimingStats:
    median_ms: float
    p25_ms: float
    p75_ms: float
    min_ms: float
    samples: int

    @property
    def spread(self) -> float:
        return (self.p75_ms - self.p25_ms) / self.median_ms if self.median_ms > 0 else 0.0


def summarize(samples_ms: Sequence[float]) -> TimingStats:
    ordered = sorted(samples_ms)
    if len(ordered) >= 4:
        q = statistics.quantiles(ordered, n=4, method="inclusive")
        p25, p75 = q[0], q[2]
    else:
        p25, p75 = ordered[0], ordered[-1]
    return TimingStats(median_ms=statistics.median(ordered), p25_ms=p25, p75_ms=p75,
                       min_ms=ordered[0], samples=len(ordered))


def net(samples: Sequence[Windows], allowance: Allowance, resolution_ms: float) -> TimingStats:
    """The calls' own times; a median below the resolution is counted as the resolution, since
    nothing finer is measured."""
    stats = summarize([allowance.net(w) for w in samples])
    median = max(stats.median_ms, resolution_ms)
    return TimingStats(median_ms=median, p25_ms=stats.p25_ms, p75_ms=stats.p75_ms,
                       min_ms=stats.min_ms, samples=stats.samples)
