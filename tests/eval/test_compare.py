"""Output comparison: tolerances by dtype, NaN/Inf, magnitude-relative error, structure."""
from __future__ import annotations

import torch

from specgen.eval.compare import compare


def test_fp32_tolerance_is_1e_4() -> None:
    ref = torch.linspace(-1, 1, 100)
    assert compare(ref + 5e-5, ref).ok
    result = compare(ref + 1e-3, ref)
    assert not result.ok and "atol 0.0001" in result.reason


def test_half_precision_gets_1e_2() -> None:
    ref = torch.linspace(-1, 1, 100).half()
    assert compare(ref + 5e-3, ref).ok


def test_nan_and_inf_never_pass() -> None:
    ref = torch.ones(10)
    cand = ref.clone()
    cand[3] = float("nan")
    assert "NaN/Inf" in compare(cand, ref).reason
    cand[3] = float("inf")
    assert not compare(cand, ref).ok
    both = torch.full((4,), float("nan"))
    assert not compare(both, both.clone()).ok


def test_near_zero_outputs_need_relative_accuracy() -> None:
    ref = torch.rand(64) * 1e-6
    zeros = torch.zeros(64)
    assert torch.allclose(zeros, ref, atol=1e-4, rtol=1e-4)  # what a plain allclose accepts
    result = compare(zeros, ref)
    assert not result.ok and "relative to the reference's magnitude" in result.reason
    assert result.max_rel > 0.9
    assert compare(ref * (1 + 1e-6), ref).ok


def test_precision_downgrade_is_recognized() -> None:
    ref = torch.randn(256)
    cand = ref.to(torch.bfloat16).float()
    result = compare(cand, ref)
    assert not result.ok and result.precision_suspect


def test_structure_shape_dtype_and_subclass() -> None:
    ref = torch.zeros(2, 3)
    assert "shape (3, 2)" in compare(torch.zeros(3, 2), ref).reason
    assert "dtype torch.float64" in compare(torch.zeros(2, 3, dtype=torch.float64), ref).reason
    assert "returned 2 outputs" in compare((ref, ref), ref).reason

    class Sub(torch.Tensor):
        pass

    result = compare(torch.zeros(2, 3).as_subclass(Sub), ref)
    assert not result.ok and result.subclass == "Sub"
    assert compare((ref, 3), (ref.clone(), 3)).ok


def test_integer_outputs_must_be_equal() -> None:
    ref = torch.arange(10)
    assert compare(ref.clone(), ref).ok
    assert not compare(ref + 1, ref).ok
