from __future__ import annotations

import pytest

from specgen.optimize.termination import (
    BeatsEarlier,
    FirstOf,
    JobStanding,
    TargetSpeedup,
    VerdictView,
    default_criterion,
)

STANDING = JobStanding(iteration=1, best_speedup=1.2, bar=1.2)


def test_target_speedup_ends_the_job() -> None:
    criterion = TargetSpeedup(2.0)
    assert criterion.check(VerdictView("c1", True, 1.9), STANDING) is None
    done = criterion.check(VerdictView("c1", True, 2.0), STANDING)
    assert done is not None and done.scope == "job" and "c1" in done.reason
    assert criterion.check(VerdictView("c2", False, 5.0), STANDING) is None
    assert criterion.check(VerdictView("c3", True, None), STANDING) is None
    with pytest.raises(ValueError):
        TargetSpeedup(0)


def test_beating_earlier_kernels_by_a_margin_ends_the_iteration() -> None:
    criterion = BeatsEarlier(0.1)
    assert criterion.check(VerdictView("c1", True, 1.3), STANDING) is None      # < 1.32
    stop = criterion.check(VerdictView("c1", True, 1.33), STANDING)
    assert stop is not None and stop.scope == "iteration"
    assert criterion.check(VerdictView("c1", False, 3.0), STANDING) is None
    with pytest.raises(ValueError):
        BeatsEarlier(-0.1)


def test_job_scope_wins_and_parts_can_be_left_out() -> None:
    both = default_criterion(2.0, 0.1)
    assert both.check(VerdictView("c", True, 2.5), STANDING).scope == "job"
    assert both.check(VerdictView("c", True, 1.5), STANDING).scope == "iteration"
    assert default_criterion(None, 0.1).check(VerdictView("c", True, 9.0), STANDING).scope \
        == "iteration"
    assert default_criterion(2.0, None).check(VerdictView("c", True, 1.5), STANDING) is None
    assert FirstOf([]).check(VerdictView("c", True, 9.0), STANDING) is None


def test_the_bar_can_be_below_the_reference() -> None:
    # Where every kernel is slower than the reference (CPU interpreter), progress still counts.
    slow = JobStanding(iteration=0, best_speedup=0.02, bar=0.004)
    stop = BeatsEarlier(0.1).check(VerdictView("c4", True, 0.02), slow)
    assert stop is not None and stop.scope == "iteration"
