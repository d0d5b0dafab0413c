"""Summaries of the judge's timed calls (eval/profiling.py measures them; docs/evaluation.md says how).

A timed call is one window on the judge's clock: from sending the reference runner the request
that hands the call's inputs over (eval/arena.py) to the kernel's receive stamp on the reply of the
runner that made the call. Nothing the runner says splits, moves or clamps it. A model's time is
the median of its windows less the median window of a call of nothing (the same path, no model
called: the inputs handed over, the outputs' bytes copied, the reply), measured in the same
runner before any candidate code was loaded there. No time below the **resolution** (the spread
p75 - p25 of the calls of nothing) is claimed. The spread of a time is (p75 - p25) / median of the
per-call times.
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


def resolution(nothing_ms: Sequence[float]) -> float:
    """No finer time is claimed than the spread (p75 - p25) of a call of nothing's window."""
    stats = summarize(nothing_ms)
    return max(stats.p75_ms - stats.p25_ms, MIN_MS)


def net(windows_ms: Sequence[float], overhead_ms: float, resolution_ms: float) -> TimingStats:
    """A model's time from its calls' windows less the overhead (a call of nothing's median),
    counted as the resolution where it is below, since nothing finer is measured; the quartiles
    are the per-call times'."""
    stats = summarize([w - overhead_ms for w in windows_ms])
    return TimingStats(median_ms=max(stats.median_ms, resolution_ms), p25_ms=stats.p25_ms,
                       p75_ms=stats.p75_ms, min_ms=stats.min_ms, samples=stats.samples)
