"""Comparison with an accurate reference: per-dtype tolerance plus the problem's own error,
NaN/Inf, magnitude-relative error, structure, the element named in a failure."""
from __future__ import annotations

import torch

from specgen.eval.compare import AccurateModel, compare_outputs, compare_tensor, tol_norm


def check(c, r, star=None, **kw):
    return compare_tensor(c, r, r if star is None else star, "output", None, None, **kw)


def test_fp32_tolerance_is_1e_4() -> None:
    ref = torch.linspace(-1, 1, 100)
    assert check(ref + 5e-5, ref).ok
    result = check(ref + 1e-3, ref)
    assert not result.ok and "atol 0.0001" in result.reason


def test_the_problems_own_error_is_allowed_for() -> None:
    accurate = torch.linspace(-1, 1, 100, dtype=torch.float64)
    as_written = (accurate + 5e-4).float()       # e.g. cuDNN's TF32 in the problem itself
    candidate = (accurate + 4e-4).float()        # closer to the truth than the problem
    assert check(candidate, as_written, accurate).ok
    # ... and a candidate closer to float64 than the float32 reference passes too.
    assert check(accurate.float(), as_written, accurate).ok
    assert not check((accurate + 2e-3).float(), as_written, accurate).ok


def test_the_failure_names_the_element_most_over_its_tolerance() -> None:
    ref = torch.full((4, 5), 100.0)
    cand = ref.clone()
    cand[0, 0] += 0.02          # large absolute error, but within rtol * 100 = 0.01? no: 0.02 > 0.0101
    cand[3, 2] = 1.0            # far off
    result = check(cand, ref)
    assert not result.ok and "index [3, 2]" in result.reason and "got 1" in result.reason
    big = torch.tensor([1000.0, 1.0])
    # index 0 has the largest absolute error but is within its tolerance (rtol * 1000)
    result = check(torch.tensor([1000.05, 1.01]), big)
    assert not result.ok and "index [1]" in result.reason


def test_half_precision_gets_1e_2() -> None:
    ref = torch.linspace(-1, 1, 100).half()
    assert check(ref + 5e-3, ref).ok


def test_nan_and_inf_never_pass() -> None:
    ref = torch.ones(10)
    cand = ref.clone()
    cand[3] = float("nan")
    assert "NaN/Inf" in check(cand, ref).reason
    cand[3] = float("inf")
    assert not check(cand, ref).ok


def test_near_zero_outputs_need_relative_accuracy() -> None:
    ref = torch.rand(64) * 1e-6
    zeros = torch.zeros(64)
    assert torch.allclose(zeros, ref, atol=1e-4, rtol=1e-4)  # what a plain allclose accepts
    result = check(zeros, ref)
    assert not result.ok and "relative to the reference's magnitude" in result.reason
    assert check(ref * (1 + 1e-6), ref).ok


def test_a_precision_downgrade_is_named() -> None:
    ref = torch.randn(256)
    result = check(ref.to(torch.bfloat16).float(), ref)
    assert not result.ok and "float16's tolerance" in result.reason


def test_structure_shape_dtype_and_integers() -> None:
    ref = torch.zeros(2, 3)
    assert "shape (3, 2)" in check(torch.zeros(3, 2), ref).reason
    assert "dtype float64" in check(torch.zeros(2, 3, dtype=torch.float64), ref).reason
    assert "returned 2 outputs" in compare_outputs([ref, ref], [ref], [ref]).reason
    ints = torch.arange(10)
    assert check(ints.clone(), ints).ok
    assert "differs (integer)" in check(ints + 1, ints).reason


def test_large_outputs_are_compared_in_chunks_with_the_same_answer() -> None:
    ref = torch.randn(3 * (1 << 24) // 2)
    cand = ref.clone()
    cand[-1] += 1.0
    result = check(cand, ref)
    assert not result.ok and f"index [{ref.numel() - 1}]" in result.reason
    assert abs(tol_norm(ref, None, None) - float(((1e-4 + 1e-4 * ref.double().abs()) ** 2).sum().sqrt())) < 1e-3


def test_chunks_agree_with_one_pass_over_the_whole_output() -> None:
    from specgen.eval import compare

    step = compare._chunk(torch.empty(1))
    ref = torch.randn(5 * step + 123, dtype=torch.float32)
    star = ref.double() + 1e-6 * torch.randn(ref.numel(), dtype=torch.float64)
    cand = ref.clone()
    cand[2 * step + 7] += 0.5           # the worst, in a middle chunk
    cand[4 * step + 1] += 0.01          # over its tolerance too, by less, in a later one
    result = check(cand, ref, star)
    assert not result.ok and f"index [{2 * step + 7}]" in result.reason
    err = (ref.double() - star).abs()
    tol = 1e-4 + 1e-4 * star.abs() + err
    assert abs(result.tol_norm - float((tol * tol).sum().sqrt())) < 1e-9 * result.tol_norm
    assert abs(result.ref_error_norm - float(err.norm())) < 1e-9 * result.ref_error_norm + 1e-15
    assert abs(result.max_abs - float((cand.double() - star).abs().max())) < 1e-12


def test_the_accurate_model_is_float64_where_it_runs() -> None:
    model = torch.nn.Linear(8, 4)
    accurate = AccurateModel(model)
    out = accurate.outputs([torch.randn(2, 8)])
    assert out[0].dtype == torch.float64 and accurate.how == "float64"

    class Float32Only(torch.nn.Module):
        def forward(self, x):
            return x @ torch.ones(3, 2)  # a float32 constant: a float64 input cannot meet it

    fallback = AccurateModel(Float32Only())
    fallback.outputs([torch.randn(3)])
    assert fallback.how.startswith("float32 without TF32")
