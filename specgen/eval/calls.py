"""The problem's module inside a runner, and what both runners share about a call's values.

`ProblemModule` makes a call's inputs: the problem's own `get_inputs()` after seeding every
generator with the call's seed, on the device. Only the reference runner makes inputs (eval/arena.py
hands them over); the candidate's runner loads the problem to build its `Model`, which the judge
times there before the candidate's code is loaded. Digests (eval/digest.py) are taken by the
reference runner only.

Importing this module imports torch: it runs in runners only.
"""
from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Callable

import torch

from specgen.eval.digest import INPUTS, OUTPUTS, digests
from specgen.eval.loader import ProblemSource, exec_source, problem_from_text
from specgen.messages import LoadProblem, OutputMeta


def seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
        np.random.seed(seed % (2**32))
    except ImportError:
        pass


def flatten(output: Any) -> list[Any]:
    """Outputs as a flat list (a tensor, or nested tuples/lists of tensors and numbers)."""
    if isinstance(output, (tuple, list)):
        return [leaf for item in output for leaf in flatten(item)]
    return [output]


def dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def output_meta(leaves: list[Any]) -> list[OutputMeta]:
    metas = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            metas.append(OutputMeta(kind="tensor", shape=list(leaf.shape),
                                    dtype=dtype_name(leaf.dtype),
                                    nbytes=leaf.numel() * leaf.element_size(),
                                    plain=type(leaf) is torch.Tensor))
        elif isinstance(leaf, (bool, int, float)):
            metas.append(OutputMeta(kind="number", value=float(leaf)))
        else:
            metas.append(OutputMeta(kind="other", text=type(leaf).__name__[:80]))
    return metas


class ProblemModule:
    """The problem's module in this runner, and how it makes inputs."""

    def __init__(self, request: LoadProblem, device: str, job_dir: Path) -> None:
        self.device = device
        os.environ["SPECGEN_PROBLEM_SCALE"] = request.scale
        self.source: ProblemSource = problem_from_text(request.problem_source,
                                                       name=request.problem_name)
        self.module = exec_source(self.source, f"specgen_problem_{self.source.sha256[:12]}",
                                  job_dir)
        self.name = request.problem_name
        seed_all(request.init_seed - 1)
        self.init_inputs = list(self.module.get_init_inputs())
        self.init_seed = request.init_seed

    def build(self, constructor: Callable[..., Any]) -> Any:
        """`constructor(*get_init_inputs())` after the shared init seed, on the device."""
        seed_all(self.init_seed)
        model = constructor(*self.init_inputs)
        if isinstance(model, torch.nn.Module):
            model = model.to(self.device)
        return model

    def inputs(self, seed: int, shape: dict[str, int]) -> list[Any]:
        """get_inputs() after seeding with `seed`, with module constants `shape` in force, made
        on the device directly (drawing GPU-sized inputs on the CPU takes seconds)."""
        saved = {name: getattr(self.module, name) for name in shape}
        try:
            for name, value in shape.items():
                setattr(self.module, name, value)
            seed_all(seed)
            with torch.device(self.device):
                made = list(self.module.get_inputs())
        finally:
            for name, value in saved.items():
                setattr(self.module, name, value)
        return [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in made]

    def shape_constants(self) -> dict[str, int]:
        """Module-level ints read by get_inputs() but not by get_init_inputs() or Model: the
        sizes a second input shape may change."""
        def names_read(fn: Any) -> set[str]:
            code = getattr(fn, "__code__", None)
            found: set[str] = set()
            stack = [code] if code is not None else []
            while stack:
                c = stack.pop()
                found |= set(c.co_names)
                stack += [k for k in c.co_consts if hasattr(k, "co_names")]
            return found

        module = self.module
        by_inputs = names_read(module.get_inputs)
        by_init = names_read(module.get_init_inputs)
        for value in vars(module.Model).values():
            by_init |= names_read(value)
        return {n: getattr(module, n) for n in sorted(by_inputs - by_init)
                if isinstance(getattr(module, n, None), int)
                and not isinstance(getattr(module, n), bool)}

    def flops(self) -> int | None:
        get_flops = getattr(self.module, "get_flops", None)
        if not callable(get_flops):
            return None
        try:
            return int(get_flops())
        except Exception:  # noqa: BLE001 - the floor check is optional
            return None


def output_digests(leaves: list[Any], digest_seed: int, device: str) -> list[float]:
    """The output tensors' digests (signs drawn by the judge after the call)."""
    return digests(leaves, digest_seed, OUTPUTS, device)


def input_digests(inputs: list[Any], digest_seed: int, device: str) -> list[float]:
    """The inputs' digests after the call (their own signs): whether the call changed them."""
    return digests(inputs, digest_seed, INPUTS, device)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
