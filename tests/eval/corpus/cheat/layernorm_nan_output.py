# problem: layernorm
# device: any
# expect: reject
# pattern: returns NaN everywhere, hoping a comparison treats NaN as matching anything
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Every comparison with NaN is False, so a check written as `not (err > tol).any()`
        # lets it through.
        return torch.full_like(x, float("nan"))
