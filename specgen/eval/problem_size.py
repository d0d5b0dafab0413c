"""How large one call of a problem is, found without allocating it, and whether a CPU should run it.

KernelBench problems are sized for a GPU, many with hard-coded sizes of gigabytes. On a CPU such a
problem does not fail: its reference timing alone takes minutes (tens of timed calls, each
reading and writing gigabytes, on top of the checked trials), and a user waits for a verdict that
says nothing about the kernel. `measure` makes `get_inputs()` and `Model(*get_init_inputs())`
under `torch.device("meta")` (shapes and dtypes, no memory: milliseconds whatever the sizes), and
`cpu_refusal` says, before anything is allocated, that the problem is meant for a GPU and how to
run it small.
"""
from __future__ import annotations

import types
from typing import Any

# One call's inputs and parameters a CPU run takes: about a second per call at a CPU's memory
# bandwidth once the reference, the candidate and their copies are counted. The small scale of
# every bundled and corpus problem is a few megabytes.
CPU_CALL_BYTES = 1 << 30


def measure(module: types.ModuleType, init_inputs: list[Any]) -> tuple[int, int]:
    """(bytes of one call's input tensors, bytes of Model's parameters and buffers), measured on
    meta tensors."""
    import torch

    with torch.device("meta"):
        inputs = list(module.get_inputs())
        model = module.Model(*init_inputs)
    input_bytes = sum(_nbytes(x) for x in inputs)
    param_bytes = 0
    if isinstance(model, torch.nn.Module):
        param_bytes = sum(_nbytes(t) for t in [*model.parameters(), *model.buffers()])
    return input_bytes, param_bytes


def _nbytes(value: Any) -> int:
    import torch

    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


def cpu_refusal(name: str, input_bytes: int, param_bytes: int, reads_scale: bool, scale: str,
                constants: dict[str, int], limit: int = CPU_CALL_BYTES) -> str | None:
    """Why a CPU does not run this problem, or None when it does. `reads_scale`: its source reads
    SPECGEN_PROBLEM_SCALE; `constants`: the module ints its `get_inputs()` reads."""
    if input_bytes + param_bytes <= limit:
        return None
    sizes = f"one call's inputs are {_human(input_bytes)}"
    if param_bytes:
        sizes += f" and its parameters {_human(param_bytes)}"
    if reads_scale and scale != "small":
        how = ("run it small: --scale small (EvalOptions(problem_scale='small')), since the "
               "problem reads SPECGEN_PROBLEM_SCALE")
    else:
        named = ", ".join(f"{k} = {v}" for k, v in constants.items())
        how = ("set its sizes smaller" + (f" ({named})" if named else "")
               + (": it has no small scale (it does not read SPECGEN_PROBLEM_SCALE)"
                  if not reads_scale else ": its small scale is still this large"))
    return (f"problem {name} is sized for a GPU: {sizes} at scale {scale!r}, more than the "
            f"{_human(limit)} a CPU run takes (its reference timing alone would take minutes). "
            f"Run it on a GPU (--device cuda:0), or {how}")


def _human(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def refusal_for(problem: Any, scale: str, limit: int = CPU_CALL_BYTES) -> str | None:
    """`cpu_refusal` of a problem loaded in a runner (eval/calls.ProblemModule), before its Model
    and inputs are made. None too where measuring failed: the load that follows says why."""
    try:
        input_bytes, param_bytes = measure(problem.module, problem.init_inputs)
        constants = problem.shape_constants()
    except Exception:  # noqa: BLE001 - the problem's code on meta tensors; judged by the real load
        return None
    return cpu_refusal(problem.name, input_bytes, param_bytes,
                       "SPECGEN_PROBLEM_SCALE" in problem.source.text, scale, constants, limit)
