"""Which verdicts judged their candidate on this host (bench/judged.py), from their fields only."""
from __future__ import annotations

import pytest

from specgen.bench.judged import not_judged_reason
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
