"""The verdict's times from the timed calls' windows, under the reference's allowance."""
from __future__ import annotations

import pytest

from specgen.eval.findings import Findings
from specgen.eval.profiling import Profiler
from specgen.eval.timing import Windows
from specgen.messages import EvalOptions, RefTiming

REF = RefTiming(ref_ms=2.0, ref_spread=0.01, samples=10, overhead_ms=0.02, resolution_ms=0.01,
                made_ms=1.0, digest_ms=0.5)


def profiler() -> Profiler:
    # Only the timing settings, the findings and the reference's timing take part here.
    found = Findings("cpu", cuda=False)
    return Profiler(found, None, None, None, EvalOptions(), None, None, REF)  # type: ignore[arg-type]


def test_the_call_window_less_an_empty_one_is_the_candidates_time() -> None:
    made = profiler()
    made._write_times(False, [Windows(made=0.9, call=c, digest=0.45) for c in (0.97, 1.02, 1.07)],
                      beside=[])
    verdict = made.findings.verdict
    assert verdict.candidate_ms == pytest.approx(1.0)
    assert verdict.speedup == pytest.approx(2.0)
    assert verdict.overhead_ms == pytest.approx(0.9 + 0.45 + 0.02)
    assert not any("longer than beside" in note for note in made.findings.notes)


def test_slower_inputs_and_digest_are_charged_and_the_verdict_says_by_how_much() -> None:
    """A candidate that does its work before saying its inputs are made, or after saying its call
    returned, is charged what those windows took beyond the reference's."""
    made = profiler()
    made._write_times(False, [Windows(made=1.6, call=0.42, digest=0.5)] * 3, beside=[])
    verdict = made.findings.verdict
    assert verdict.candidate_ms == pytest.approx(1.0)
    (note,) = [n for n in made.findings.notes if "longer than beside" in n]
    assert "0.6000 ms" in note


def test_the_reference_timed_beside_is_taken_only_when_lower() -> None:
    made = profiler()
    calls = [Windows(made=1.0, call=1.02, digest=0.5)] * 3
    made._write_times(False, calls, beside=[Windows(made=1.0, call=1.52, digest=0.5)] * 3)
    assert made.findings.verdict.ref_ms == pytest.approx(1.5)
    slower = profiler()
    slower._write_times(False, calls, beside=[Windows(made=1.0, call=3.02, digest=0.5)] * 3)
    assert slower.findings.verdict.ref_ms == pytest.approx(2.0)
