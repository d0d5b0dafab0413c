"""The judge's time statistics: median, spread, what is taken off a call's window, the resolution."""
from __future__ import annotations

import pytest

from specgen.eval.timing import MIN_MS, net, resolution, summarize


def test_summary_is_median_and_interquartile_spread() -> None:
    stats = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert stats.median_ms == 3.0 and stats.p25_ms == 2.0 and stats.p75_ms == 4.0
    assert stats.spread == pytest.approx(2.0 / 3.0) and stats.samples == 5


def test_a_calls_time_is_its_window_less_an_empty_one() -> None:
    assert net([1.52, 1.62, 1.72], overhead_ms=1.02, resolution_ms=0.01).median_ms == \
        pytest.approx(0.6)
    # calls indistinguishable from calling nothing: counted at the resolution, never at zero
    assert net([1.0, 1.01, 0.99], overhead_ms=1.0, resolution_ms=0.05).median_ms == 0.05


def test_the_per_call_quartiles_are_the_windows_less_the_overhead() -> None:
    stats = net([1.0, 2.0, 3.0, 4.0, 5.0], overhead_ms=0.5, resolution_ms=0.01)
    assert (stats.p25_ms, stats.median_ms, stats.p75_ms) == pytest.approx((1.5, 2.5, 3.5))


def test_the_resolution_is_the_spread_of_the_calls_of_nothing() -> None:
    assert resolution([0.02, 0.03, 0.04, 0.05, 0.06]) == pytest.approx(0.02)
    assert resolution([0.5] * 5) == MIN_MS           # never finer than 1 us


@pytest.mark.parametrize("candidate_ms, flagged", [(0.169, False), (0.14, True)])
def test_beyond_floor_flags_only_times_under_half_the_floor(candidate_ms: float, flagged: bool) -> None:
    """1 GB read on an H100 (floor 0.306 ms): an honest sum read 0.169 ms there, the overhead
    subtracted being another process's; under half the floor no kernel of any kind goes."""
    from specgen.eval.findings import Findings
    from specgen.eval.profiling import Profiler
    from specgen.messages import EvalOptions, ProblemLoaded, RunnerReady

    profiler = object.__new__(Profiler)
    profiler.findings = Findings("cuda:0", cuda=True)
    profiler.options = EvalOptions()
    profiler.loaded = ProblemLoaded(input_bytes=1 << 30)
    profiler.ready = RunnerReady(role="reference", pid=1, device="cuda:0",
                                 device_name="NVIDIA H100 80GB HBM3")
    profiler._floor(candidate_ms, resolution_ms=0.01)
    assert profiler.findings.verdict.floor_ms == pytest.approx(0.3056, abs=1e-3)
    assert ("beyond-floor" in profiler.findings.flags) is flagged
