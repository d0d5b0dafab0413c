"""RMS normalization over the last dimension with a learnable weight (initialised to ones):
out = x / sqrt(mean(x ** 2) + eps) * weight, eps 1e-6.

x is (batch_size, seq_len, dim). SPECGEN_PROBLEM_SCALE=small picks a CPU-sized instance;
otherwise x is 128 MB.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 2 if SMALL else 8
seq_len = 16 if SMALL else 1024
dim = 96 if SMALL else 4096


class Model(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x * inv_rms * self.weight


def get_inputs():
    return [torch.randn(batch_size, seq_len, dim)]


def get_init_inputs():
    return [dim]
