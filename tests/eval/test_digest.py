"""The digest (specgen/eval/digest.py): its three paths give one number, it tells right values in
the wrong shape, order, seed or salt apart, and a right output's digest stays inside the bound
`compare.digest_bound` allows while a wrong one does not."""
from __future__ import annotations

import math
import statistics

import pytest
import torch

from specgen.eval import digest
from specgen.eval.compare import digest_bound

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.bool, torch.complex64]


def _fallback(x: torch.Tensor, seed: int, salt: int = digest.OUTPUTS, position: int = 0) -> float:
    return digest.torch_digest(digest._prepared(x), digest.tensor_seed(seed, salt, position,
                                                                       tuple(x.shape)))


def _tensor(dtype: torch.dtype, shape: tuple[int, ...], device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    if dtype == torch.bool:
        return (torch.randn(shape, generator=g) > 0).to(device)
    if dtype in (torch.int32, torch.int64):
        return torch.randint(-1000, 1000, shape, generator=g, dtype=dtype).to(device)
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype).to(device)
    return (torch.randn(shape, generator=g) * 10).to(dtype).to(device)


def test_the_compiled_module_is_built() -> None:
    # `pip install -e .` builds it; without it every digest takes the slower torch path.
    assert digest.extension() is not None


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_host_loop_and_the_torch_fallback_agree(dtype: torch.dtype) -> None:
    for shape in [(), (1,), (3, 1000, 7), (5_000_001,)]:
        x = _tensor(dtype, shape)
        [host] = digest.digests([x], 123, digest.OUTPUTS, "cpu")
        assert host == pytest.approx(_fallback(x, 123), rel=1e-12, abs=1e-9), (dtype, shape)


def test_without_the_compiled_module_the_torch_path_gives_the_same(monkeypatch) -> None:
    xs = [_tensor(torch.float32, (64, 33)), 3, _tensor(torch.float16, (7,))]
    with_module = digest.digests(xs, 99, digest.INPUTS, "cpu")
    monkeypatch.setattr(digest, "extension", lambda: None)
    assert digest.digests(xs, 99, digest.INPUTS, "cpu") == pytest.approx(with_module, rel=1e-12)


def test_a_strided_tensor_is_read_in_row_major_order() -> None:
    x = _tensor(torch.float32, (40, 30))
    assert digest.digests([x.t()], 5, 0, "cpu") == pytest.approx(
        digest.digests([x.t().contiguous()], 5, 0, "cpu"), rel=1e-12)


def test_seed_salt_position_and_shape_each_change_the_signs() -> None:
    x = _tensor(torch.float32, (16, 16))
    [base] = digest.digests([x], 1, digest.OUTPUTS, "cpu")
    assert digest.digests([x], 2, digest.OUTPUTS, "cpu")[0] != base
    assert digest.digests([x], 1, digest.INPUTS, "cpu")[0] != base
    assert digest.digests([x.clone(), x], 1, digest.OUTPUTS, "cpu")[1] != base
    assert digest.digests([x.reshape(256)], 1, digest.OUTPUTS, "cpu")[0] != base
    assert digest.digests([x.reshape(8, 32)], 1, digest.OUTPUTS, "cpu")[0] != base


def test_non_tensors_are_skipped_and_a_tensor_elsewhere_is_nan() -> None:
    x = _tensor(torch.float32, (4,))
    out = digest.digests([1.5, x, "text", x], 3, 0, "cpu")
    assert len(out) == 2 and all(math.isfinite(v) for v in out)
    [elsewhere] = digest.digests([x], 3, 0, "cuda:0")
    assert math.isnan(elsewhere)


def test_the_difference_of_two_digests_has_the_deviation_of_the_error() -> None:
    # sum(e x s) over 2,000 seeds: mean about 0, deviation about |e|, never past the bound's 6 |e|.
    reference = _tensor(torch.float32, (4096,))
    error = torch.randn(4096, generator=torch.Generator().manual_seed(3)) * 1e-3
    norm = float(error.double().norm())
    diffs = [a - b for a, b in ((digest.digests([reference + error], s, 0, "cpu")[0],
                                 digest.digests([reference], s, 0, "cpu")[0]) for s in range(2000))]
    assert abs(statistics.fmean(diffs)) < 0.1 * norm
    assert statistics.pstdev(diffs) == pytest.approx(norm, rel=0.1)
    assert max(abs(d) for d in diffs) < 6 * norm


def test_a_right_output_passes_the_bound_and_a_wrong_element_does_not() -> None:
    reference = _tensor(torch.float32, (256, 256))
    tol = 1e-4 + 1e-4 * reference.double().abs()
    tol_norm = float(tol.norm())
    within = reference + (torch.rand(reference.shape, generator=torch.Generator().manual_seed(1))
                          * 2 - 1) * tol.float()
    wrong = reference.clone()
    wrong[17, 3] += 50.0
    for seed in range(50):
        [r] = digest.digests([reference], seed, 0, "cpu")
        [c] = digest.digests([within], seed, 0, "cpu")
        [w] = digest.digests([wrong], seed, 0, "cpu")
        assert abs(c - r) <= digest_bound(reference, 0.0, r)
        assert abs(w - r) > digest_bound(reference, 0.0, r)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_cuda_kernel_agrees_with_the_torch_fallback(dtype: torch.dtype) -> None:
    assert digest.extension().cuda_compiled()
    for shape in [(), (1,), (3, 1000, 7), (16, 64, 256, 256)]:
        x = _tensor(dtype, shape, "cuda:0")
        [gpu] = digest.digests([x], 11, digest.OUTPUTS, "cuda:0")
        assert gpu == pytest.approx(_fallback(x, 11), rel=1e-12, abs=1e-9), (dtype, shape)
        assert gpu == pytest.approx(digest.digests([x.cpu()], 11, 0, "cpu")[0], rel=1e-12, abs=1e-9)


@pytest.mark.gpu
def test_the_cuda_kernel_runs_on_the_current_stream_after_the_work_queued_there() -> None:
    x = torch.zeros(1 << 24, device="cuda:0")
    stream = torch.cuda.Stream("cuda:0")
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)          # the fill below runs well after the launch
        x.fill_(1.0)
        got = digest.digests([x, x[:5]], 4, 0, "cuda:0")
    expected = [_fallback(torch.ones(1 << 24), 4), _fallback(torch.ones(5), 4, position=1)]
    assert got == pytest.approx(expected, rel=1e-12)
