from __future__ import annotations

import pytest

from specgen.errors import UsageError
from specgen.messages import OptimizeSpec, TriggerSettings
from specgen.optimize.modes import MODES, Mechanisms, check_spec


def spec(**kw) -> OptimizeSpec:
    return OptimizeSpec(job_id="j", problem_name="p", problem_source="x = 1\n", **kw)


def test_baselines_use_no_speculation() -> None:
    for mode in MODES:
        mech = Mechanisms.of(spec(mode=mode))
        assert (mech.forking and mech.early_termination) == (mode == "specgen")
    assert Mechanisms.of(spec(mode="sequential")).describe() == "none"


def test_each_mechanism_switches_off_alone() -> None:
    for name in ("forking", "early_termination", "inline_candidates", "load_aware",
                 "elastic_pools"):
        mech = Mechanisms.of(spec(**{name: False}))
        assert getattr(mech, name) is False
        assert sum(vars(mech).values()) == 4


@pytest.mark.parametrize("bad, words", [
    (dict(mode="greedy"), "unknown mode"),
    (dict(max_iterations=0), "max_iterations"),
    (dict(time_budget_s=0), "time budget"),
    (dict(token_budget=-1), "token budget"),
    (dict(target_speedup=0), "target speedup"),
    (dict(mode="best-of-n", best_of_n=0), "best_of_n"),
    (dict(verdict_timeout_s=0), "verdict_timeout_s"),
    (dict(triggers=TriggerSettings(min_gap_tokens=-1)), "min_gap_tokens"),
])
def test_bad_settings_are_named(bad, words) -> None:
    with pytest.raises(UsageError, match=words):
        check_spec(spec(**bad))
    check_spec(spec())
