"""The verdict's times from the timed calls' windows, less the overhead of a call of nothing timed in
the same process before the candidate's code was loaded (or, without one, in the reference runner)."""
from __future__ import annotations

import pytest

from specgen.eval.findings import Findings
from specgen.eval.profiling import Profiler
from specgen.messages import EvalOptions, RefTiming

REF = RefTiming(ref_ms=2.0, ref_spread=0.01, samples=10, overhead_ms=0.5, resolution_ms=0.01)


def profiler(local: RefTiming | None = None) -> Profiler:
    # Only the timing settings, the findings and the reference's timings take part here.
    found = Findings("cpu", cuda=False)
    made = Profiler(found, None, None, None, EvalOptions(), None, None, REF)  # type: ignore[arg-type]
    made.local = local
    return made


def test_the_window_less_an_empty_one_is_the_candidates_time() -> None:
    made = profiler()
    made._write_times(False, [1.45, 1.5, 1.55], beside=[])
    verdict = made.findings.verdict
    assert verdict.candidate_ms == pytest.approx(1.0)
    assert verdict.speedup == pytest.approx(2.0)
    assert verdict.overhead_ms == pytest.approx(0.5)


def test_the_reference_timed_beside_is_taken_only_when_lower() -> None:
    made = profiler()
    made._write_times(False, [1.5] * 3, beside=[2.0] * 3)
    assert made.findings.verdict.ref_ms == pytest.approx(1.5)
    assert any("between the candidate's calls" in note for note in made.findings.notes)
    slower = profiler()
    slower._write_times(False, [1.5] * 3, beside=[3.5] * 3)
    assert slower.findings.verdict.ref_ms == pytest.approx(2.0)


def test_the_reference_timed_in_the_candidates_runner_sets_the_time_and_the_overhead() -> None:
    """The reference's timing in the candidate's own process, before its code was loaded, is what
    the candidate is measured against: its time and the overhead taken off (a process slower than
    the reference runner's makes both sides' windows longer alike)."""
    local = RefTiming(ref_ms=3.0, ref_spread=0.01, samples=15, overhead_ms=0.8, resolution_ms=0.01)
    made = profiler(local)
    made._write_times(False, [2.3] * 3, beside=[])
    verdict = made.findings.verdict
    assert verdict.ref_ms == pytest.approx(3.0)
    assert verdict.candidate_ms == pytest.approx(1.5)
    assert verdict.speedup == pytest.approx(2.0)


def test_times_below_the_resolution_claim_no_speedup() -> None:
    local = RefTiming(ref_ms=0.001, ref_spread=0.01, samples=15, overhead_ms=0.5, resolution_ms=0.2)
    made = profiler(local)
    made._write_times(False, [0.55] * 3, beside=[])
    verdict = made.findings.verdict
    assert verdict.speedup == pytest.approx(1.0)
    assert verdict.candidate_ms == pytest.approx(0.2) and verdict.ref_ms == pytest.approx(0.2)


def test_timed_calls_stop_once_the_budget_is_spent_and_the_floor_is_met() -> None:
    """A GB-sized problem's call takes tens of ms with its handover and reading: the budget ends
    its timing, never before min_timing_trials calls."""
    import time

    made = profiler()
    made.options = EvalOptions(timing_budget_s=0.5, min_timing_trials=10)
    long_ago = time.monotonic() - 1.0
    assert not made._enough(9, long_ago)
    assert made._enough(10, long_ago)
    assert not made._enough(40, time.monotonic())
