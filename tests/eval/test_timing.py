"""The judge's time statistics: median, spread, what is taken off a call's windows, the resolution."""
from __future__ import annotations

import pytest

from specgen.eval.timing import Allowance, Windows, net, summarize


def test_summary_is_median_and_interquartile_spread() -> None:
    stats = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert stats.median_ms == 3.0 and stats.p25_ms == 2.0 and stats.p75_ms == 4.0
    assert stats.spread == pytest.approx(2.0 / 3.0) and stats.samples == 5


def test_a_calls_time_is_its_call_window_less_an_empty_one() -> None:
    allowance = Allowance(made_ms=1.0, digest_ms=0.5, overhead_ms=0.02)
    calls = [Windows(made=0.9, call=c, digest=0.4) for c in (0.52, 0.62, 0.72)]
    assert net(calls, allowance, resolution_ms=0.01).median_ms == pytest.approx(0.6)
    # calls indistinguishable from calling nothing: counted at the resolution, never at zero
    empty = [Windows(made=1.0, call=0.02, digest=0.5)] * 3
    assert net(empty, allowance, resolution_ms=0.05).median_ms == 0.05


def test_inputs_and_digest_beyond_the_allowance_count_as_the_calls() -> None:
    """The runner says where its windows end: work moved out of the call window into the others
    is charged once they pass the reference's medians."""
    allowance = Allowance(made_ms=1.0, digest_ms=0.5, overhead_ms=0.0)
    honest = Windows(made=1.0, call=0.3, digest=0.5)
    moved = Windows(made=1.2, call=0.05, digest=0.55)       # 0.25 ms of the call moved out
    assert allowance.net(honest) == pytest.approx(0.3)
    assert allowance.net(moved) == pytest.approx(0.3)
    assert allowance.taken_off(moved) == pytest.approx(1.5)


def test_a_models_time_takes_each_window_at_its_median() -> None:
    allowance = Allowance(made_ms=1.0, digest_ms=0.5, overhead_ms=0.0)
    calls = [Windows(made=1.0, call=0.3, digest=0.5), Windows(made=3.0, call=0.31, digest=0.5),
             Windows(made=0.9, call=0.29, digest=0.9)]
    assert Windows.medians(calls) == Windows(made=1.0, call=0.3, digest=0.5)
    # one call's slow inputs and another's slow digest are not charged: their medians are within
    assert net(calls, allowance, resolution_ms=0.01).median_ms == pytest.approx(0.3)


def test_the_allowance_is_the_references_medians_and_the_resolution_what_lies_below() -> None:
    calls = [Windows(made=m, call=5.0, digest=d) for m, d in
             ((1.0, 0.4), (1.1, 0.5), (1.2, 0.6), (1.3, 0.7), (1.4, 0.8))]
    nothing = [Windows(made=1.0, call=c, digest=0.5) for c in (0.02, 0.03, 0.04, 0.05, 0.06)]
    allowance = Allowance.of(calls, nothing)
    assert (allowance.made_ms, allowance.digest_ms, allowance.overhead_ms) == \
        pytest.approx((1.2, 0.6, 0.04))
    # empty call window p75 - p25, plus made and digest p50 - p25
    assert Allowance.resolution(calls, nothing) == pytest.approx(0.02 + 0.1 + 0.1)


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
