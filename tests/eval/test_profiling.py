"""The verdict's times from the timed calls' windows, under the allowance of the reference's timing in
the same process (or, without one, in the reference runner)."""
from __future__ import annotations

import pytest

from specgen.eval.findings import Findings
from specgen.eval.profiling import Profiler
from specgen.eval.timing import Windows
from specgen.messages import EvalOptions, RefTiming

REF = RefTiming(ref_ms=2.0, ref_spread=0.01, samples=10, overhead_ms=0.02, resolution_ms=0.01,
                made_ms=1.0, digest_ms=0.5)


def profiler(local: RefTiming | None = None) -> Profiler:
    # Only the timing settings, the findings and the reference's timings take part here.
    found = Findings("cpu", cuda=False)
    made = Profiler(found, None, None, None, EvalOptions(), None, None, REF)  # type: ignore[arg-type]
    made.local = local
    return made


def test_the_call_window_less_an_empty_one_is_the_candidates_time() -> None:
    made = profiler()
    made._write_times(False, [Windows(made=0.9, call=c, digest=0.45) for c in (0.97, 1.02, 1.07)],
                      beside=[])
    verdict = made.findings.verdict
    assert verdict.candidate_ms == pytest.approx(1.0)
    assert verdict.speedup == pytest.approx(2.0)
    assert verdict.overhead_ms == pytest.approx(0.9 + 0.45 + 0.02)
    assert not any("longer than" in note for note in made.findings.notes)


def test_slower_inputs_and_digest_are_charged_and_the_verdict_says_by_how_much() -> None:
    """A candidate that does its work before saying its inputs are made, or after saying its call
    returned, is charged what those windows took beyond the reference's."""
    made = profiler()
    made._write_times(False, [Windows(made=1.6, call=0.42, digest=0.5)] * 3, beside=[])
    verdict = made.findings.verdict
    assert verdict.candidate_ms == pytest.approx(1.0)
    (note,) = [n for n in made.findings.notes if "longer than" in n]
    assert "0.6000 ms" in note


def test_the_reference_timed_beside_is_taken_only_when_lower() -> None:
    made = profiler()
    calls = [Windows(made=1.0, call=1.02, digest=0.5)] * 3
    made._write_times(False, calls, beside=[Windows(made=1.0, call=1.52, digest=0.5)] * 3)
    assert made.findings.verdict.ref_ms == pytest.approx(1.5)
    slower = profiler()
    slower._write_times(False, calls, beside=[Windows(made=1.0, call=3.02, digest=0.5)] * 3)
    assert slower.findings.verdict.ref_ms == pytest.approx(2.0)


def test_the_reference_timed_in_the_candidates_runner_sets_the_time_and_the_allowance() -> None:
    """The reference's timing in the candidate's own process, before its code was loaded, is what
    the candidate is measured against: its time and the allowance of its windows (a process
    slower than the reference runner's makes both sides' windows longer alike)."""
    local = RefTiming(ref_ms=3.0, ref_spread=0.01, samples=15, overhead_ms=0.05,
                      resolution_ms=0.01, made_ms=1.5, digest_ms=0.8)
    made = profiler(local)
    made._write_times(False, [Windows(made=1.5, call=1.55, digest=0.8)] * 3, beside=[])
    verdict = made.findings.verdict
    assert verdict.ref_ms == pytest.approx(3.0)
    assert verdict.candidate_ms == pytest.approx(1.5)       # nothing charged: within its allowance
    assert verdict.speedup == pytest.approx(2.0)
    assert not any("longer than" in note for note in made.findings.notes)


def test_each_window_is_taken_at_its_median_so_one_slow_window_is_not_charged() -> None:
    """Windows of inputs that vary by more than the kernel takes charge nothing while their median
    stays within the allowance; work moved out of the call in most calls is charged in full."""
    noisy = [Windows(made=m, call=1.02, digest=0.5) for m in (0.7, 1.0, 1.6)]
    made = profiler()
    made._write_times(False, noisy, beside=[])
    assert made.findings.verdict.candidate_ms == pytest.approx(1.0)
    moved = [Windows(made=m, call=c, digest=0.5) for m, c in ((1.0, 1.02), (1.9, 0.12), (1.9, 0.12))]
    cheat = profiler()
    cheat._write_times(False, moved, beside=[])
    assert cheat.findings.verdict.candidate_ms == pytest.approx(1.0)
