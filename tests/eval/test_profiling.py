"""The verdict's times from the timed calls: the overhead subtracted and its cap."""
from __future__ import annotations

import pytest

from specgen.eval.findings import Findings
from specgen.eval.profiling import Profiler
from specgen.messages import EvalOptions, RefTiming

REF = RefTiming(ref_ms=2.0, ref_spread=0.01, samples=10, overhead_ms=0.30, resolution_ms=0.02)


def profiler() -> Profiler:
    # Only the timing settings, the findings and the reference's timing take part here.
    found = Findings("cpu", cuda=False)
    made = Profiler(found, None, None, None, EvalOptions(), None, None, REF)  # type: ignore[arg-type]
    made.resolution_ms = 0.02
    return made


def test_the_overhead_measured_beside_the_candidate_is_subtracted_below_the_cap() -> None:
    made = profiler()
    made._write_times(False, [1.25, 1.3, 1.35], overhead=0.30, beside=[])
    verdict = made.findings.verdict
    assert verdict.overhead_ms == pytest.approx(0.30)
    assert verdict.candidate_ms == pytest.approx(1.0)
    assert verdict.speedup == pytest.approx(2.0)
    assert not any("calls of nothing" in note for note in made.findings.notes)


def test_slower_calls_of_nothing_are_capped_and_the_verdict_says_by_how_much() -> None:
    """A candidate that keeps the machine busy between its calls slows the calls of nothing: it is
    charged that time (not helped by it), and the note gives both figures."""
    made = profiler()
    made._write_times(False, [1.25, 1.3, 1.35], overhead=0.90, beside=[])
    verdict = made.findings.verdict
    assert verdict.overhead_ms == pytest.approx(0.32)           # the reference's, plus its spread
    assert verdict.candidate_ms == pytest.approx(0.98)
    (note,) = [n for n in made.findings.notes if "beside the candidate took" in n]
    assert "0.9000 ms" in note and "0.3200 ms was subtracted" in note
