"""How far a right output's digest may be from the reference's (eval/output_checks.py)."""
from __future__ import annotations

import math

import pytest

from specgen.eval.output_checks import digest_bound


def test_the_digest_bound_grows_with_the_tolerance_and_the_references_own_error() -> None:
    assert digest_bound(1.0, 0.0, 0.0) == pytest.approx(6.0, rel=1e-6)
    assert digest_bound(1.0, 0.5, 10.0) > digest_bound(1.0, 0.0, 10.0)


# -- whether the inputs changed, decided by the judge over digests whose last bits wander

class _Replies:
    """The two runners' replies to one checked call, in order (the transport is not under test:
    what the judge makes of the replies is)."""

    def __init__(self, *replies) -> None:
        self.replies = list(replies)
        self.candidate, self.reference = "candidate", "reference"

    def ask(self, runner, message, expect, fds=()):
        reply = self.replies.pop(0)
        assert isinstance(reply, expect)
        return type("Received", (), {"message": reply})()


def _checked(pristine: list[float], after: list[float], candidate_after: list[float]):
    from specgen.eval.findings import Findings
    from specgen.eval.output_checks import OutputChecks
    from specgen.messages import Compared, EvalOptions, OutputMeta, Shipped, Trial, TrialDone

    meta = [OutputMeta(kind="tensor", shape=[4], dtype="float32", nbytes=16)]
    findings = Findings("cuda:0", cuda=True)
    replies = _Replies(
        TrialDone(index=0, digests=[1.5], outputs=meta, input_digests=candidate_after),
        Shipped(index=0),
        Compared(ok=True, digests=[1.5], tol_norms=[1e-3], ref_error_norms=[0.0], outputs=meta,
                 input_digests=after, pristine_digests=pristine))
    checks = OutputChecks(findings, replies, EvalOptions(), [])
    try:
        assert checks.checked(Trial(index=0, seed=1, digest_seed=2), "trial 0")
    finally:
        checks.close()
    return findings, checks


def test_a_reference_whose_input_digests_differ_in_the_last_bits_does_not_mutate() -> None:
    """On a GPU the digest's float64 sum is added up by blocks in whatever order they finish, so
    two digests of the same input differ in the last bits. Read as 'the reference changes its
    inputs', that turned the mutated-inputs check off, and candidates that zero or overwrite
    their inputs were accepted."""
    digest = 1234.5678901234
    wandered = digest + 4 * math.ulp(digest)
    findings, checks = _checked([digest], [wandered], candidate_after=[0.0])
    assert not checks.reference_mutates
    assert "mutated-inputs" in findings.flags


def test_a_reference_that_changes_its_inputs_lets_the_candidate_change_them() -> None:
    findings, checks = _checked([1234.5], [17.25], candidate_after=[0.0])
    assert checks.reference_mutates and not findings.flags


def test_an_honest_candidate_whose_input_digest_wanders_is_not_flagged() -> None:
    digest = -98.765432109876
    findings, checks = _checked([digest], [digest], candidate_after=[digest - 8 * math.ulp(digest)])
    assert not checks.reference_mutates and not findings.flags
