"""Summaries of the judge's timed calls (eval/profiling.py measures them; docs/evaluation.md says how).

A timed call is three windows on the judge's clock (`Windows`): making the inputs, the call, the
digest, each ended by a message whose arrival the kernel stamps. A model's time is the median of
its call windows, plus whatever the medians of its other two windows came to beyond the
reference's, less the median call window of a call of nothing (`net`, `Allowance.net`): the
runner that sends the messages decides where one window ends and the next begins, and this way
moving work out of the call window gains it no more than the reference's windows' spread.
Medians per window, not a median of per-call sums: a call's windows of inputs and digest vary by
more than a small kernel takes (0.1 ms on a 2-core host), and charging each call its own excess
adds that noise to every time. The spread is (p75 - p25) / median of the per-call times.
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

    @classmethod
    def medians(cls, samples: Sequence[Windows]) -> Windows:
        """Each window's median over the calls."""
        return cls(made=statistics.median(w.made for w in samples),
                   call=statistics.median(w.call for w in samples),
                   digest=statistics.median(w.digest for w in samples))


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
        """What the windows of inputs and digest took beyond the allowance: charged."""
        return max(0.0, windows.made - self.made_ms) + max(0.0, windows.digest - self.digest_ms)

    def net(self, windows: Windows) -> float:
        """The call's own time (of `Windows.medians`: the model's time)."""
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
    """A model's time from its calls' windows (the module doc), counted as the resolution where
    it is below, since nothing finer is measured; the quartiles are the per-call times'."""
    stats = summarize([allowance.net(w) for w in samples])
    median = max(allowance.net(Windows.medians(samples)), resolution_ms)
    return TimingStats(median_ms=median, p25_ms=stats.p25_ms, p75_ms=stats.p75_ms,
                       min_ms=stats.min_ms, samples=stats.samples)
