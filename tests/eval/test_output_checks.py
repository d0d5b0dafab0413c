"""How far a right output's digest may be from the reference's (eval/output_checks.py)."""
from __future__ import annotations

import pytest

from specgen.eval.output_checks import digest_bound


def test_the_digest_bound_grows_with_the_tolerance_and_the_references_own_error() -> None:
    assert digest_bound(1.0, 0.0, 0.0) == pytest.approx(6.0, rel=1e-6)
    assert digest_bound(1.0, 0.5, 10.0) > digest_bound(1.0, 0.0, 10.0)
