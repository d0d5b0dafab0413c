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
