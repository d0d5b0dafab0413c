"""The judge's time statistics: median, spread, the overhead subtracted, the resolution floor."""
from __future__ import annotations

import pytest

from specgen.eval.timing import net, summarize


def test_summary_is_median_and_interquartile_spread() -> None:
    stats = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert stats.median_ms == 3.0 and stats.p25_ms == 2.0 and stats.p75_ms == 4.0
    assert stats.spread == pytest.approx(2.0 / 3.0) and stats.samples == 5


def test_the_overhead_is_subtracted_and_no_time_goes_below_the_resolution() -> None:
    assert net([1.5, 1.6, 1.7], overhead_ms=0.5, resolution_ms=0.01).median_ms == pytest.approx(1.1)
    # calls indistinguishable from calling nothing: counted at the resolution, never at zero
    assert net([0.49, 0.5, 0.51], overhead_ms=0.5, resolution_ms=0.05).median_ms == 0.05

