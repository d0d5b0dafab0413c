"""Fused elementwise chain: out = tanh((x + y) * scale).

x and y are (batch_size, dim); scale is a learnable per-column vector of length dim, initialised
to ones. SPECGEN_PROBLEM_SCALE=small picks a CPU-sized instance; otherwise x and y are 64 MB each.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 16 if SMALL else 4096
dim = 160 if SMALL else 4096


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.tanh((x + y) * self.scale)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
