"""`evaluate()`: strings or files in, a verdict out; bad input raises UsageError."""
from __future__ import annotations

import pytest

from specgen.errors import UsageError
from specgen.eval import EvalOptions, evaluate
from tests.eval.conftest import BUNDLED

OPTIONS = EvalOptions(trials=2, timing_trials=3, warmup=1)


def test_evaluate_from_source_strings() -> None:
    problem = (BUNDLED / "fused_elementwise.py").read_text()
    candidate = (BUNDLED / "candidates" / "fused_elementwise_triton.py").read_text()
    verdict = evaluate(problem, candidate, device="cpu", options=OPTIONS)
    assert verdict.correct and verdict.stage == "full" and verdict.cpu_timing
    assert verdict.ref_ms > 0 and verdict.candidate_ms > 0
    assert set(verdict.stage_seconds) >= {"load", "correctness", "guards", "timing", "total"}


def test_evaluate_raises_for_bad_input() -> None:
    with pytest.raises(UsageError, match="no ModelNew defined"):
        evaluate(BUNDLED / "softmax.py", "import torch\nx = 1\n", options=OPTIONS)
    with pytest.raises(UsageError, match="device must be 'cpu' or 'cuda:N'"):
        evaluate(BUNDLED / "softmax.py", BUNDLED / "candidates" / "softmax_torch.py",
                 device="tpu", options=OPTIONS)
