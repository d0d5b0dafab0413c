"""The bench report's rules (bench/report.py): which verdicts judged their candidate, and how a
share of a ceiling's saving is printed."""
from __future__ import annotations

import pytest

from specgen.bench.report import (MIN_CEILING_SAVING, ceiling_lines, not_judged_reason,
                                  saving_against_ceiling)
from specgen.messages import VERDICT_CODES


@pytest.mark.parametrize("compiled, code, device, judged", [
    (True, "", "cpu", True),                # built and ran: right, wrong or flagged
    (True, "", "cuda:0", True),
    (False, "", "cuda:1", True),            # a compile or load error on the GPU: wrong
    (False, "", "cpu", False),              # on a CPU host it may be CUDA that cannot run here
    (False, "candidate_source", "cpu", True),   # no program of the problem: wrong anywhere
    (False, "candidate", "cuda:0", True),   # its run sent what the judge could not handle
    (False, "timeout", "cuda:0", False),
    (True, "timeout", "cuda:0", False),
    (False, "cancelled", "cuda:0", False),
    (False, "build", "cuda:0", False),      # the build never finished: no compiler's word on it
    (False, "reference", "cuda:0", False),
    (False, "refused", "cpu", False),
    (False, "no_runner", "cuda:0", False),
    (False, "problem", "cuda:0", False),
])
def test_a_verdict_judged_its_candidate_by_its_fields(compiled, code, device, judged) -> None:
    why = not_judged_reason(compiled, code, device)
    assert (why == "") is judged
    if not judged:
        assert why and why != code or code == ""     # said in words, not as the bare code


def test_every_verdict_code_has_a_rule() -> None:
    # A code added to the messages without a decision here would be reported as its bare name.
    for code in VERDICT_CODES:
        assert not_judged_reason(False, code, "cuda:0") != code, code


def test_a_share_of_a_ceilings_saving_is_printed_only_where_it_means_something() -> None:
    # Between nothing and all of the ceiling's saving, with a ceiling worth sharing: the share.
    assert saving_against_ceiling(0.997, 0.956) == (
        "specgen saved 0.3% of sequential time, the ceiling saves 4.4%: 7% of its saving achieved")
    assert saving_against_ceiling(0.954, 0.524).endswith("10% of its saving achieved")
    # A ceiling that saves almost nothing: both savings, no "459%".
    tiny = saving_against_ceiling(0.954, 0.99)
    assert "459%" not in tiny and "%" in tiny and "achieved" not in tiny
    assert tiny == ("specgen saved 4.6% of sequential time; the ceiling saves 1.0%, too little for "
                    "a share of it to mean anything")
    assert 1.0 - 0.99 < MIN_CEILING_SAVING
    # Slower than sequential: no negative share.
    slower = saving_against_ceiling(1.02, 0.8)
    assert slower == ("specgen saved nothing against sequential (it took 2.0% longer); the ceiling "
                      "saves 20.0%: no share of it")
    # More than the ceiling saves: said, not printed as a share above 100%.
    beyond = saving_against_ceiling(0.5, 0.8)
    assert "more than this ceiling's 20.0%" in beyond and "achieved" not in beyond
    # A ceiling that saves nothing (no draft of any answer).
    assert saving_against_ceiling(0.9, 1.0).endswith("the ceiling saves nothing: no share of it")
    assert saving_against_ceiling(1.0, 1.0) == ("specgen saved nothing against sequential; the "
                                                "ceiling saves nothing: no share of it")


def test_ceiling_lines_name_both_ceilings() -> None:
    lines = ceiling_lines(0.9, 0.8, 0.99)
    assert lines[0].startswith("specgen / sequential end to end 0.900 against the draft ceiling 0.800: ")
    assert lines[0].endswith("50% of its saving achieved")
    assert "named ceiling 0.990" in lines[1] and "too little for a share" in lines[1]
    assert ceiling_lines(None, 0.8, 0.5) == []
