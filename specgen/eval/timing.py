"""Summaries of the judge's timed calls (eval/profiling.py measures them; docs/evaluation.md says how).

Every sample is one call's time on the judge's clock with the overhead (the same path timed with
no call at all) subtracted. The median is the verdict's time; the spread is (p75 - p25) / median.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

MIN_MS = 1e-3                   # 1 us: no finer time is claimed, whatever the overhead's spread


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


def net(samples_ms: list[float], overhead_ms: float, resolution_ms: float) -> TimingStats:
    """The calls' own times: each sample less the overhead; a median below the resolution (the
    overhead's own spread) is counted as the resolution, since nothing finer is measured."""
    stats = summarize([s - overhead_ms for s in samples_ms])
    median = max(stats.median_ms, resolution_ms)
    return TimingStats(median_ms=median, p25_ms=stats.p25_ms, p75_ms=stats.p75_ms,
                       min_ms=stats.min_ms, samples=stats.samples)
