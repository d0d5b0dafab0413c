"""A chain of elementwise operations: gelu(x + bias) * sigmoid(y) (KernelBench level 2 style).

Kind: elementwise.
Sizes: GPU-sized by default; SPECGEN_PROBLEM_SCALE=small gives a CPU-sized instance.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 16 if SMALL else 8192
dim = 96 if SMALL else 16384


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.gelu(x + self.bias) * torch.sigmoid(y)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
