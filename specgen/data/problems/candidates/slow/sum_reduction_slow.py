# problem: sum_reduction
# kind: slow
# lang: torch
"""Sum over one dimension by adding the slices one at a time in a Python loop: correct (same
order as a sequential sum), but one small add per slice of the reduced axis."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        slices = x.unbind(self.dim)
        total = torch.zeros_like(slices[0])
        for piece in slices:
            total = total + piece
        return total.unsqueeze(self.dim)
