"""Comparing a candidate's outputs with the reference's.

A trial passes only when, for every output tensor:
* the structure, shape and dtype match and the output is a plain `torch.Tensor`;
* every candidate value is finite (NaN and Inf never pass, not even where the reference has them);
* `|c - r| <= atol + rtol * |r|` elementwise, with the tolerance of the reference's dtype
  (fp32 1e-4/1e-4, fp16/bf16 1e-2/1e-2, as KernelBench);
* `max|c - r| / max|r| <= 10 * rtol`: an error relative to the reference's magnitude, so that
  outputs near zero cannot pass by the absolute tolerance alone (returning zeros for outputs of
  size 1e-5 passes `allclose` but gives a relative error of 1).

When a trial fails but would pass at fp16's tolerance, the failure is reported as a likely
precision downgrade (the `precision` flag) rather than a plain mismatch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# dtype name -> (atol, rtol)
_TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-4), "float64": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2), "bfloat16": (1e-2, 1e-2),
}
_HALF_TOLERANCE = (1e-2, 1e-2)
REL_BOUND_FACTOR = 10.0


@dataclass
class Comparison:
    ok: bool
    reason: str | None = None              # why it failed, for the verdict's error
    max_abs: float = 0.0
    max_rel: float = 0.0
    precision_suspect: bool = False        # fails its tolerance, passes fp16's
    subclass: str | None = None            # type name when an output is a tensor subclass


def tolerance_for(dtype: Any, atol: float | None = None, rtol: float | None = None
                  ) -> tuple[float, float]:
    base = _TOLERANCES.get(str(dtype).replace("torch.", ""), (1e-4, 1e-4))
    return (base[0] if atol is None else atol, base[1] if rtol is None else rtol)


def flatten(output: Any) -> list[Any]:
    """Outputs as a flat list (a tensor, or nested tuples/lists of tensors and numbers)."""
    if isinstance(output, (tuple, list)):
        return [leaf for item in output for leaf in flatten(item)]
    return [output]


def compare(candidate: Any, reference: Any, atol: float | None = None,
            rtol: float | None = None) -> Comparison:
    import torch

    cand, ref = flatten(candidate), flatten(reference)
    if len(cand) != len(ref):
        return Comparison(False, f"returned {len(cand)} outputs, the reference returns {len(ref)}")
    result = Comparison(True)
    for index, (c, r) in enumerate(zip(cand, ref)):
        label = f"output {index}" if len(ref) > 1 else "output"
        if isinstance(r, torch.Tensor):
            if not isinstance(c, torch.Tensor):
                return Comparison(False, f"{label} is {type(c).__name__}, expected a tensor")
            if type(c) is not torch.Tensor:
                return Comparison(False, f"{label} is a {type(c).__name__}, not a plain tensor",
                                  subclass=type(c).__name__)
            one = _compare_tensor(c, r, label, atol, rtol)
        else:
            one = _compare_scalar(c, r, label, atol, rtol)
        result.max_abs = max(result.max_abs, one.max_abs)
        result.max_rel = max(result.max_rel, one.max_rel)
        if not one.ok:
            one.max_abs, one.max_rel = result.max_abs, result.max_rel
            return one
    return result


def _compare_tensor(c: Any, r: Any, label: str, atol: float | None, rtol: float | None
                    ) -> Comparison:
    import torch

    if tuple(c.shape) != tuple(r.shape):
        return Comparison(False, f"{label} has shape {tuple(c.shape)}, expected {tuple(r.shape)}")
    if c.dtype != r.dtype:
        return Comparison(False, f"{label} has dtype {c.dtype}, expected {r.dtype}")
    if c.device != r.device:
        return Comparison(False, f"{label} is on {c.device}, expected {r.device}")
    if not (c.is_floating_point() or c.is_complex()):
        same = bool(torch.equal(c, r))
        diff = 0.0 if same else float((c.long() - r.long()).abs().max())
        return Comparison(same, None if same else f"{label} differs (integer, max diff {diff})",
                          max_abs=diff, max_rel=0.0 if same else 1.0)
    if c.numel() == 0:
        return Comparison(True)
    # fp32 arithmetic is exact enough for these tolerances and halves the memory of fp64 on
    # GPU-sized outputs; fp64 outputs stay fp64.
    wide = torch.float64 if r.dtype == torch.float64 else torch.float32
    c64, r64 = c.detach().to(wide), r.detach().to(wide)
    finite = torch.isfinite(c64)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        return Comparison(False, f"{label} has {bad} NaN/Inf values", max_abs=float("inf"),
                          max_rel=float("inf"))
    if not bool(torch.isfinite(r64).all()):
        return Comparison(False, f"the reference's {label} has NaN/Inf values: the problem's "
                                 "inputs do not give a comparable result", max_abs=float("inf"),
                          max_rel=float("inf"))
    a_tol, r_tol = tolerance_for(r.dtype, atol, rtol)
    diff = (c64 - r64).abs()
    max_abs = float(diff.max())
    # Relative to the reference's own magnitude, however small; only an all-zero reference
    # (no magnitude at all) falls back to the absolute tolerance.
    scale = float(r64.abs().max()) or a_tol
    max_rel = max_abs / scale
    within = bool((diff <= a_tol + r_tol * r64.abs()).all())
    rel_ok = max_rel <= REL_BOUND_FACTOR * r_tol
    if within and rel_ok:
        return Comparison(True, max_abs=max_abs, max_rel=max_rel)
    half_a, half_r = _HALF_TOLERANCE
    precision_suspect = (r_tol < half_r and bool((diff <= half_a + half_r * r64.abs()).all())
                         and max_rel <= REL_BOUND_FACTOR * half_r)
    if not within:
        worst = int(diff.argmax())
        reason = (f"{label} mismatch: max abs error {max_abs:.3g} (atol {a_tol:g}, rtol {r_tol:g}); "
                  f"at flat index {worst} got {float(c64.flatten()[worst]):.6g}, expected "
                  f"{float(r64.flatten()[worst]):.6g}")
    else:
        reason = (f"{label} error {max_rel:.3g} relative to the reference's magnitude "
                  f"{scale:.3g} exceeds {REL_BOUND_FACTOR * r_tol:g}")
    return Comparison(False, reason, max_abs=max_abs, max_rel=max_rel,
                      precision_suspect=precision_suspect)


def _compare_scalar(c: Any, r: Any, label: str, atol: float | None, rtol: float | None
                    ) -> Comparison:
    import math

    if isinstance(r, (int, float)) and isinstance(c, (int, float)) and not isinstance(c, bool):
        if not math.isfinite(float(c)):
            return Comparison(False, f"{label} is {c}", max_abs=float("inf"), max_rel=float("inf"))
        a_tol, r_tol = tolerance_for("float32", atol, rtol)
        diff = abs(float(c) - float(r))
        ok = diff <= a_tol + r_tol * abs(float(r))
        return Comparison(ok, None if ok else f"{label} is {c}, expected {r}", max_abs=diff,
                          max_rel=diff / max(abs(float(r)), a_tol))
    ok = c == r
    return Comparison(bool(ok), None if ok else f"{label} is {c!r}, expected {r!r}")
