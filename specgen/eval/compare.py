"""Comparing a candidate's output with an accurate reference value (in the reference runner).

The reference value is the problem's Model computed in float64 (model and floating inputs cast;
`accurate_outputs`), where the model allows it, else in float32 with TF32 off; the problem as
written (its dtypes, torch's default settings, cuDNN's TF32 for convolutions among them) is the
reference that is timed and whose own error the tolerance allows for. Per element, with r* the
accurate value and r the problem as written:

    |c - r*| <= atol + rtol * |r*| + |r - r*|

(atol = rtol = 1e-4 for float32 and float64 outputs, 1e-2 for float16 and bfloat16, as
KernelBench; `EvalOptions.atol`/`rtol` override). So a candidate at least as accurate as the
problem's own computation passes, a rewrite closer to float64 than the float32 reference passes,
and a candidate that lowered precision beyond the problem's fails. Also:

* structure, shape and dtype match, and every value is finite (NaN and Inf never pass);
* `max|c - r*| / max|r*| <= 10 rtol + max|r - r*| / max|r*|`: outputs near zero cannot pass on the
  absolute tolerance alone (zeros for outputs of size 1e-5 pass `allclose` but are all wrong);
* integer and boolean outputs equal the problem's exactly.

A failure names the element that exceeds its tolerance by the most (index, value, accurate value,
tolerance), and says when the output would pass at float16's tolerance (a precision downgrade?).
Work is done in chunks of float64, so comparing a GPU-sized output needs little extra memory.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import torch

# dtype name -> (atol, rtol)
TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-4), "float64": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2), "bfloat16": (1e-2, 1e-2),
}
HALF_TOLERANCE = (1e-2, 1e-2)
REL_BOUND_FACTOR = 10.0
# Elements per float64 chunk. On a GPU large ones (few launches and reads back); on a CPU small
# ones, whose temporaries (2 MB) stay in cache through the dozen passes over each: a 64 MiB output
# compared in 144 ms instead of 916 ms with 16M-element chunks (CPU VM, side by side:
# tools/output_path_bench.py --cpu-chunks, BENCHMARKS.md).
_CHUNK = 1 << 24
_CPU_CHUNK = 1 << 18


def _chunk(tensor: Any) -> int:
    return _CHUNK if tensor.is_cuda else _CPU_CHUNK


def tolerance_for(dtype: Any, atol: float | None = None, rtol: float | None = None
                  ) -> tuple[float, float]:
    base = TOLERANCES.get(str(dtype).replace("torch.", ""), (1e-4, 1e-4))
    return (base[0] if atol is None else atol, base[1] if rtol is None else rtol)


@dataclass
class TensorComparison:
    ok: bool
    reason: str | None = None
    max_abs: float = 0.0
    max_rel: float = 0.0
    tol_norm: float = 0.0           # sqrt(sum((atol + rtol |r*| + |r - r*|)^2))
    ref_error_norm: float = 0.0     # sqrt(sum((r - r*)^2))
    half_ok: bool = False


@dataclass
class OutputComparison:
    ok: bool = True
    reason: str | None = None
    max_abs: float = 0.0
    max_rel: float = 0.0
    tol_norms: list[float] = field(default_factory=list)
    ref_error_norms: list[float] = field(default_factory=list)
    half_ok: bool = True


def _cast_input(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.to(torch.float64)
    return x


WIDE_LIMIT_BYTES = 16 << 30     # float64 copies of one call's inputs and outputs, at most


class AccurateModel:
    """The problem's model as an accurate reference: a float64 copy where it runs, else the
    model itself in float32 with TF32 off. Rebuilt after its parameters change.

    Which one is a rule of the problem's size, not of the device's free memory: a call whose
    inputs and outputs take more than WIDE_LIMIT_BYTES in float64 (`wide_bytes`) is computed in
    float32 without TF32 on every card (a float64 softmax over 6.4 GB fell back on an 80 GB card
    and not on a 141 GB one, so the tolerance a candidate met depended on the card)."""

    def __init__(self, model: Any, wide_bytes: int = 0) -> None:
        self.model = model
        self._wide: Any = None
        self.how = ""
        if wide_bytes > WIDE_LIMIT_BYTES:
            self.how = (f"float32 without TF32 (in float64 one call's inputs and outputs take "
                        f"{wide_bytes / 2**30:.1f} GiB, over the {WIDE_LIMIT_BYTES >> 30} GiB "
                        "computed in float64)")

    def invalidate(self) -> None:
        self._wide = None

    def outputs(self, inputs: list[Any]) -> list[Any]:
        from specgen.eval.calls import flatten

        if self.how in ("", "float64"):
            try:
                if self._wide is None:
                    self._wide = copy.deepcopy(self.model).to(torch.float64) \
                        if isinstance(self.model, torch.nn.Module) else self.model
                with torch.no_grad():
                    out = flatten(self._wide(*[_cast_input(x) for x in inputs]))
                self.how = "float64"
                return out
            except Exception as exc:  # noqa: BLE001 - some models do not run in float64
                self._wide = None
                self.how = (f"float32 without TF32 (float64 failed: {type(exc).__name__}: "
                            f"{str(exc)[:120]})")
        with no_tf32(), torch.no_grad():
            return flatten(self.model(*inputs))


class no_tf32:
    """TF32 off for matmuls and convolutions while the block runs (settings put back after)."""

    def __enter__(self) -> None:
        self.saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                      torch.get_float32_matmul_precision())
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")

    def __exit__(self, *exc: object) -> None:
        matmul, cudnn, precision = self.saved
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn
        torch.set_float32_matmul_precision(precision)


def tol_norm(r: Any, atol: float | None, rtol: float | None) -> float:
    """sqrt(sum((atol + rtol |r|)^2)) over a tensor's elements (0 for non-float outputs), from
    sum |r| and sum r^2: two reductions in float64, no temporaries of the tensor's size."""
    if not isinstance(r, torch.Tensor) or not (r.is_floating_point() or r.is_complex()):
        return 0.0
    a_tol, r_tol = tolerance_for(r.dtype, atol, rtol)
    count = r.numel()
    absolute = _norm(r, 1)
    square = l2_norm(r) ** 2
    return math.sqrt(max(count * a_tol * a_tol + 2 * a_tol * r_tol * absolute
                         + r_tol * r_tol * square, 0.0))


def _norm(r: Any, order: int) -> float:
    values = r.detach()
    if values.is_complex():
        values = torch.view_as_real(values)
    return float(torch.linalg.vector_norm(values, ord=order, dtype=torch.float64)) \
        if values.numel() else 0.0


def l2_norm(r: Any) -> float:
    """sqrt(sum(r^2)), accumulated in float64."""
    return _norm(r, 2)


DIGEST_SIGMAS = 6.0             # a right output's digest misses by more than this < 3e-8 of the time


def same_digests(a: list[float], b: list[float]) -> bool:
    """Digests of the same values: equal but for the order of the float64 sum, which on a GPU
    changes from one digest to the next (blocks add their parts atomically), so never compared
    with `==`."""
    return len(a) == len(b) and all(math.isfinite(x) and abs(x - y) <= 1e-9 * (abs(y) + 1.0)
                                    for x, y in zip(a, b))


def digest_bound(r: Any, ref_error_norm: float, reference: float, atol: float | None = None,
                 rtol: float | None = None) -> float:
    """How far a right output's digest may be from the digest `reference` of the reference's
    output `r` (eval/digest.py).

    With signs s drawn after the call and e = output - r independent of them, sum(e x s) has mean
    0, deviation |e| (L2) and sub-Gaussian tails (Hoeffding: P(> k |e|) <= 2 exp(-k^2 / 2)). A
    right output has |e| at most the tolerance's norm plus the reference's own error, and, as
    the element rule bounds the largest error by 10 rtol of the largest value, at most 10 rtol
    |r|: without that second bound a constant passes wherever the values are below the absolute
    tolerance (a softmax over 393,216 columns is about 2.5e-6 everywhere)."""
    tol = tol_norm(r, atol, rtol)
    if isinstance(r, torch.Tensor) and (r.is_floating_point() or r.is_complex()):
        _, r_tol = tolerance_for(r.dtype, atol, rtol)
        tol = min(tol, REL_BOUND_FACTOR * r_tol * l2_norm(r))
    return DIGEST_SIGMAS * (tol + ref_error_norm) + 1e-9 * abs(reference) + 1e-12


def compare_outputs(cand: list[Any], ref: list[Any], accurate: list[Any],
                    atol: float | None = None, rtol: float | None = None) -> OutputComparison:
    """Compare flattened outputs (see the module doc). `cand` tensors must be on the device."""
    result = OutputComparison()
    if len(cand) != len(ref):
        return OutputComparison(False, f"returned {len(cand)} outputs, the reference returns "
                                       f"{len(ref)}", half_ok=False)
    for index, (c, r, star) in enumerate(zip(cand, ref, accurate)):
        label = f"output {index}" if len(ref) > 1 else "output"
        if isinstance(r, torch.Tensor):
            if not isinstance(c, torch.Tensor):
                return OutputComparison(False, f"{label} is {type(c).__name__}, expected a tensor",
                                        half_ok=False)
            one = compare_tensor(c, r, star if isinstance(star, torch.Tensor) else r, label,
                                 atol, rtol)
        else:
            one = _compare_number(c, r, label, atol, rtol)
        result.max_abs = max(result.max_abs, one.max_abs)
        result.max_rel = max(result.max_rel, one.max_rel)
        result.tol_norms.append(one.tol_norm)
        result.ref_error_norms.append(one.ref_error_norm)
        result.half_ok = result.half_ok and one.half_ok
        if not one.ok and result.ok:
            result.ok, result.reason = False, one.reason
    return result


def compare_tensor(c: Any, r: Any, star: Any, label: str, atol: float | None,
                   rtol: float | None) -> TensorComparison:
    if tuple(c.shape) != tuple(r.shape):
        return TensorComparison(False, f"{label} has shape {tuple(c.shape)}, expected "
                                       f"{tuple(r.shape)}")
    if c.dtype != r.dtype:
        return TensorComparison(False, f"{label} has dtype {str(c.dtype)[6:]}, expected "
                                       f"{str(r.dtype)[6:]}")
    if r.is_complex():
        c, r, star = torch.view_as_real(c), torch.view_as_real(r), torch.view_as_real(star)
    if not r.is_floating_point():
        same = bool(torch.equal(c, r))
        if same:
            return TensorComparison(True, half_ok=True)
        diff = (c.to(torch.int64) - r.to(torch.int64)).abs()
        worst = int(diff.reshape(-1).argmax())
        return TensorComparison(False, f"{label} differs (integer): at {_index(worst, r.shape)} "
                                       f"got {int(c.reshape(-1)[worst])}, expected "
                                       f"{int(r.reshape(-1)[worst])}",
                                max_abs=float(diff.max()), max_rel=1.0)
    if c.numel() == 0:
        return TensorComparison(True, half_ok=True)
    a_tol, r_tol = tolerance_for(r.dtype, atol, rtol)
    half_a, half_r = HALF_TOLERANCE
    cf, rf, sf = c.detach().reshape(-1), r.detach().reshape(-1), star.detach().reshape(-1)
    max_abs = max_ref_err = scale = 0.0
    tol_sq = err_sq = 0.0
    bad = 0
    worst_excess, worst_at = -math.inf, -1
    within_half = True
    step = _chunk(cf)
    for start in range(0, cf.numel(), step):
        cc = cf[start:start + step].to(torch.float64)
        ss = sf[start:start + step].to(torch.float64)
        ref_err = (rf[start:start + step].to(torch.float64) - ss).abs()
        finite = torch.isfinite(cc)
        if not bool(finite.all()):
            bad += int((~finite).sum())
            continue
        diff = (cc - ss).abs()
        tol = a_tol + r_tol * ss.abs() + ref_err
        excess = diff - tol
        at = int(excess.argmax())
        if float(excess[at]) > worst_excess:
            worst_excess, worst_at = float(excess[at]), start + at
        max_abs = max(max_abs, float(diff.max()))
        max_ref_err = max(max_ref_err, float(ref_err.max()))
        scale = max(scale, float(ss.abs().max()))
        tol_sq += float((tol * tol).sum())
        err_sq += float((ref_err * ref_err).sum())
        if within_half:
            within_half = bool((diff <= half_a + half_r * ss.abs() + ref_err).all())
        del cc, ss, ref_err, diff, tol, excess
    if bad:
        return TensorComparison(False, f"{label} has {bad} NaN/Inf values", max_abs=math.inf,
                                max_rel=math.inf)
    scale = scale or a_tol
    max_rel = max_abs / scale
    rel_limit = REL_BOUND_FACTOR * r_tol + max_ref_err / scale
    result = TensorComparison(True, max_abs=max_abs, max_rel=max_rel, tol_norm=math.sqrt(tol_sq),
                              ref_error_norm=math.sqrt(err_sq),
                              half_ok=within_half and max_rel <= REL_BOUND_FACTOR * half_r)
    if worst_excess > 0:
        got, want = float(cf[worst_at]), float(sf[worst_at])
        allowed = a_tol + r_tol * abs(want) + abs(float(rf[worst_at]) - want)
        result.ok = False
        result.reason = (f"{label} mismatch: at {_index(worst_at, r.shape)} got {got:.6g}, "
                         f"expected {want:.6g} (error {abs(got - want):.3g} over its tolerance "
                         f"{allowed:.3g}: atol {a_tol:g}, rtol {r_tol:g} and the problem's own "
                         f"error there); max abs error {max_abs:.3g}")
    elif max_rel > rel_limit:
        result.ok = False
        result.reason = (f"{label} error {max_rel:.3g} relative to the reference's magnitude "
                         f"{scale:.3g} exceeds {rel_limit:.3g}")
    if not result.ok and result.half_ok and r_tol < half_r:
        result.reason = f"{result.reason}; it would pass at float16's tolerance (precision lowered?)"
    return result


def _compare_number(c: Any, r: Any, label: str, atol: float | None, rtol: float | None
                    ) -> TensorComparison:
    if isinstance(r, (int, float)) and isinstance(c, (int, float)) and not isinstance(c, bool):
        if not math.isfinite(float(c)):
            return TensorComparison(False, f"{label} is {c}", max_abs=math.inf, max_rel=math.inf)
        a_tol, r_tol = tolerance_for("float32", atol, rtol)
        diff = abs(float(c) - float(r))
        ok = diff <= a_tol + r_tol * abs(float(r))
        return TensorComparison(ok, None if ok else f"{label} is {c}, expected {r}", max_abs=diff,
                                max_rel=diff / max(abs(float(r)), a_tol), half_ok=ok)
    ok = c == r
    return TensorComparison(bool(ok), None if ok else f"{label} is {c!r}, expected {r!r}",
                            half_ok=bool(ok))


def _index(flat: int, shape: Any) -> str:
    dims = list(shape)
    if not dims:
        return "the only element"
    coords = []
    for size in reversed(dims):
        coords.append(flat % size if size else 0)
        flat //= size if size else 1
    return "index [" + ", ".join(str(i) for i in reversed(coords)) + "]"
