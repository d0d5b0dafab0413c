"""Evidence from inside the candidate's runner that its own kernels ran.

`LaunchCounter` counts Triton kernel launches (compiled or interpreted) and the errors they raise,
into the same ledger as the extension proxy (eval/extensions.py). It runs in the candidate's
process, so it can only ever reject: a candidate that defines kernels and shows no launch, or whose
kernel raised while the call carried on, is flagged; a count the candidate inflated gains it
nothing the judge does not check (its outputs and times).
"""
from __future__ import annotations

from typing import Any, Callable

from specgen.eval.extensions import KernelLedger


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
