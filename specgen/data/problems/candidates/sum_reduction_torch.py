# problem: sum_reduction
# kind: honest
# lang: torch
"""Sum over one dimension in plain PyTorch as a matrix product with a row of ones: the tensor
viewed as (outer, reduced, inner), ones(1, reduced) @ it gives (outer, 1, inner), the kept
dimension, in one BLAS call."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim = self.dim % x.dim()
        shape = list(x.shape)
        reduced = shape[dim]
        outer = 1
        for size in shape[:dim]:
            outer *= size
        ones = torch.ones(1, reduced, dtype=x.dtype, device=x.device)
        out = torch.matmul(ones, x.reshape(outer, reduced, -1))
        shape[dim] = 1
        return out.reshape(shape)
