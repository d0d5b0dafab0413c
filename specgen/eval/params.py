"""Random parameter values loaded into both models (the reference's and the candidate's).

Outputs baked in for the initial weights, or parameters that do not line up with the reference's,
show only when the weights change: the judge asks both runners to load the same random values,
drawn from one seed in the reference's parameter order (`draw`), then runs a trial. The candidate
runner matches its parameters to the reference's list by name, else by order, with the same
number of elements (a flattened copy lines up, a differently sized one does not); the values are
reshaped to its own shapes. Importing this module imports torch: runners only.
"""
from __future__ import annotations

from typing import Any

import torch

from specgen.messages import ParamInfo


def describe(model: Any) -> list[ParamInfo]:
    if not isinstance(model, torch.nn.Module):
        return []
    return [ParamInfo(name=name, shape=list(p.shape), numel=p.numel())
            for name, p in model.named_parameters()]


def match(reference: list[ParamInfo], model: Any) -> list[torch.nn.Parameter] | str:
    """The model's parameters in the reference's order, or why they do not line up."""
    own = list(model.named_parameters()) if isinstance(model, torch.nn.Module) else []
    if len(own) != len(reference):
        return (f"Model has {_listing(reference)}; ModelNew has "
                f"{_listing([ParamInfo(name=n, shape=list(p.shape), numel=p.numel()) for n, p in own])}")
    by_name = dict(own)
    if set(by_name) == {r.name for r in reference} and all(
            by_name[r.name].numel() == r.numel for r in reference):
        return [by_name[r.name] for r in reference]
    if all(p.numel() == r.numel for (_, p), r in zip(own, reference)):
        return [p for _, p in own]
    return (f"Model has {_listing(reference)}; ModelNew has "
            f"{_listing([ParamInfo(name=n, shape=list(p.shape), numel=p.numel()) for n, p in own])}")


def draw(reference: list[ParamInfo], seed: int, initial: list[torch.Tensor]) -> list[torch.Tensor]:
    """New values per reference parameter: each initial value scaled by a factor in [0.5, 1.5)
    plus a tenth of its spread of noise (so values keep the magnitudes the model expects)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    values = []
    for info, start in zip(reference, initial):
        shape = tuple(info.shape)
        noise = torch.randn(shape, generator=generator, dtype=torch.float32)
        factor = 0.5 + torch.rand(shape, generator=generator, dtype=torch.float32)
        base = start.detach().float().cpu().reshape(shape)
        spread = float(base.std()) if base.numel() > 1 else 0.0
        values.append(base * factor + 0.1 * (spread if spread > 0 else 1.0) * noise)
    return values


class ParamState:
    """One model's parameters in the reference's order, with their initial values kept."""

    def __init__(self, params: list[torch.nn.Parameter], reference: list[ParamInfo]) -> None:
        self.params = params
        self.reference = reference
        self.initial = [p.detach().clone() for p in params]

    def load(self, seed: int | None) -> None:
        """Random values from `seed` (the same in both models), or the initial ones for None.
        The reference's initial values are what the draw starts from on both sides."""
        if seed is None:
            values = self.initial
        else:
            values = draw(self.reference, seed, self.initial)
        with torch.no_grad():
            for param, value in zip(self.params, values):
                param.copy_(value.to(param.dtype).reshape(param.shape).to(param.device))


def _listing(params: list[ParamInfo]) -> str:
    if not params:
        return "no parameters"
    shown = ", ".join(f"{p.name}{tuple(p.shape)}" for p in params[:6])
    return shown + (f" and {len(params) - 6} more" if len(params) > 6 else "")
