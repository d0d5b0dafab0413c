"""Dynamic guard instrumentation, installed in a runner before the candidate's module executes.

* `Sentinels` remembers the identity of every attribute of the modules and classes the evaluation
  trusts (timers, events, synchronization, comparison functions, RNG, torch's functional ops,
  `nn.Module` classes, the problem's own module). After the candidate's module ran and after each
  of its calls, anything replaced is reported (`probes.check_globals`) and put back, so the
  harness stays trustworthy.
* `LaunchCounter` counts Triton kernel launches (compiled or interpreted) and errors they raise.
* `ThreadCounter` counts threads the candidate starts.
* `precision_state()` reads the global settings that change numerical precision.
"""
from __future__ import annotations

import _thread
import threading
import time
import types
from typing import Any, Callable

from specgen.eval.extensions import KernelLedger


def _trusted_namespaces() -> list[tuple[str, Any]]:
    import torch
    import torch.nn.functional as F

    spaces: list[tuple[str, Any]] = [
        ("time", time), ("torch", torch), ("torch.nn.functional", F), ("torch.Tensor", torch.Tensor),
        ("torch.nn.Module", torch.nn.Module), ("torch.cuda", torch.cuda), ("torch.fft", torch.fft),
        ("torch.linalg", torch.linalg), ("torch.special", torch.special),
        ("torch.testing", torch.testing), ("torch.random", torch.random),
        ("torch.utils.cpp_extension", torch.utils.cpp_extension),
        ("torch.backends", torch.backends),
    ]
    if hasattr(torch.cuda, "Event"):
        spaces.append(("torch.cuda.Event", torch.cuda.Event))
        spaces.append(("torch.cuda.Stream", torch.cuda.Stream))
    for name in dir(torch.nn.modules):
        obj = getattr(torch.nn.modules, name)
        if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
            spaces.append((f"torch.nn.{name}", obj))
    try:
        import triton
        import triton.language as tl
        spaces += [("triton", triton), ("triton.language", tl)]
        from triton.runtime import jit
        spaces.append(("triton.runtime.jit.JITFunction", jit.JITFunction))
        spaces.append(("triton.testing", triton.testing))
    except ImportError:
        pass
    return spaces


def _namespace_dict(obj: Any) -> dict[str, Any]:
    if isinstance(obj, types.ModuleType):
        return obj.__dict__
    return dict(vars(obj))


class Sentinels:
    """Identity snapshots of trusted namespaces; `check()` reports and restores replacements."""

    def __init__(self, extra: list[tuple[str, Any]] | None = None) -> None:
        self._spaces = _trusted_namespaces() + list(extra or [])
        self._snapshot: list[tuple[str, Any, dict[str, Any]]] = [
            (label, obj, dict(_namespace_dict(obj))) for label, obj in self._spaces]

    def add(self, label: str, obj: Any) -> None:
        self._snapshot.append((label, obj, dict(_namespace_dict(obj))))

    def check(self) -> list[str]:
        """Names of trusted attributes that were replaced, added or removed; restores them."""
        changed: list[str] = []
        for label, obj, saved in self._snapshot:
            current = _namespace_dict(obj)
            if len(current) == len(saved) and all(
                    current.get(name, _MISSING) is value for name, value in saved.items()):
                continue
            for name, value in saved.items():
                now = current.get(name, _MISSING)
                if now is value:
                    continue
                if _torch_rewrap(now, value):
                    saved[name] = now  # torch's own wrapper of the same function: not a patch
                    continue
                changed.append(f"{label}.{name}")
                _restore(obj, name, value)
            for name in set(current) - set(saved):
                if not name.startswith("__") and not _is_lazy_cache(label, name):
                    changed.append(f"{label}.{name} (added)")
                    _remove(obj, name)
        return changed


_MISSING = object()
_REWRAP_CODE: list[Any] = []


def _torch_rewrap(new: Any, old: Any) -> bool:
    """True when torch itself wrapped `old` (importing torch._dynamo, which the profiler and
    torch.compile do, rewraps torch.manual_seed with `torch._disable_dynamo`)."""
    if getattr(new, "__wrapped__", None) is not old:
        return False
    if not _REWRAP_CODE:
        import torch
        disable = getattr(torch, "_disable_dynamo", None)
        _REWRAP_CODE.append(disable(lambda: None).__code__ if disable else None)
    return _REWRAP_CODE[0] is not None and getattr(new, "__code__", None) is _REWRAP_CODE[0]


def _is_lazy_cache(label: str, name: str) -> bool:
    # torch and triton fill some module attributes lazily on first use (submodule imports,
    # cached properties); those are not the candidate's doing.
    return label in ("torch", "triton", "torch.cuda", "torch.backends", "triton.language",
                     "torch.testing", "torch.utils.cpp_extension") or name.startswith("_")


def _restore(obj: Any, name: str, value: Any) -> None:
    try:
        setattr(obj, name, value)
    except (AttributeError, TypeError):
        pass


def _remove(obj: Any, name: str) -> None:
    try:
        delattr(obj, name)
    except (AttributeError, TypeError):
        pass


class LaunchCounter:
    """Counts launches of Triton kernels into a ledger by wrapping `run` of the kernel classes."""

    def __init__(self, ledger: KernelLedger) -> None:
        self.ledger = ledger
        self.installed = False

    def install(self) -> None:
        try:
            from triton.runtime.jit import JITFunction
        except ImportError:
            return
        classes: list[type] = [JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction
            classes.append(InterpretedFunction)
        except ImportError:
            pass
        for cls in classes:
            cls.run = self._wrap(cls.run)
        self.installed = True

    def _wrap(self, run: Callable[..., Any]) -> Callable[..., Any]:
        ledger = self.ledger

        def counted_run(kernel: Any, *args: Any, **kwargs: Any) -> Any:
            if not kwargs.get("warmup", False):
                ledger.launches += 1
            try:
                return run(kernel, *args, **kwargs)
            except Exception as exc:
                name = getattr(kernel, "__name__", type(kernel).__name__)
                ledger.errors.append(f"triton kernel {name}: {type(exc).__name__}: {exc}"[:500])
                raise
        counted_run.__wrapped__ = run  # type: ignore[attr-defined]
        return counted_run


class ThreadCounter:
    """Counts threads started through `threading` or `_thread` after installation."""

    def __init__(self) -> None:
        self.started = 0
        self._base = threading.Thread.start
        self._base_new = _thread.start_new_thread

    def install(self) -> None:
        counter = self
        base, base_new = self._base, self._base_new

        def start(thread: threading.Thread) -> None:
            counter.started += 1
            base(thread)

        def start_new_thread(*args: Any, **kwargs: Any) -> Any:
            counter.started += 1
            return base_new(*args, **kwargs)

        threading.Thread.start = start  # type: ignore[method-assign]
        _thread.start_new_thread = start_new_thread  # type: ignore[assignment]


def precision_state() -> dict[str, Any]:
    """Global settings that change the precision of computations in this process."""
    import torch

    state: dict[str, Any] = {
        "torch.get_default_dtype()": torch.get_default_dtype(),
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
        "torch.backends.cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "torch.backends.cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction":
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction":
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "torch.is_autocast_enabled('cpu')": torch.is_autocast_enabled("cpu"),
    }
    if torch.cuda.is_available():
        state["torch.is_autocast_enabled('cuda')"] = torch.is_autocast_enabled("cuda")
    return state


def restore_precision(state: dict[str, Any]) -> None:
    import torch

    torch.set_default_dtype(state["torch.get_default_dtype()"])
    torch.set_float32_matmul_precision(state["torch.get_float32_matmul_precision()"])
    torch.backends.cuda.matmul.allow_tf32 = state["torch.backends.cuda.matmul.allow_tf32"]
    torch.backends.cudnn.allow_tf32 = state["torch.backends.cudnn.allow_tf32"]
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = state[
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction"]
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = state[
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction"]
