"""The bench report's rules (bench/report.py): how a share of a ceiling's saving is printed."""
from __future__ import annotations

from specgen.bench.report import MIN_CEILING_SAVING, ceiling_lines, saving_against_ceiling


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
