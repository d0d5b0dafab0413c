"""Layer normalization over the last dimension with a learnable weight and bias (nn.LayerNorm,
eps 1e-5): out = (x - mean) / sqrt(var + eps) * weight + bias, var being the biased variance.

x is (batch_size, dim). SPECGEN_PROBLEM_SCALE=small picks a CPU-sized instance; otherwise x is
80 MB.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 16 if SMALL else 4096
dim = 96 if SMALL else 5120


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
