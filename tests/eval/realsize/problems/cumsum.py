"""Inclusive prefix sum along dimension 1: out[i, j] = sum(x[i, :j + 1]).

KernelBench's size: x is (32768, 32768) float32, 4.3 GB. Inputs from torch.rand, so a row's sums
grow to about 16,384: float32 keeps about 0.002 there, inside the tolerance (1e-4 relative).
SPECGEN_PROBLEM_SCALE=small picks a CPU-sized instance.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 8 if SMALL else 32768
length = 300 if SMALL else 32768
scan_dim = 1


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=self.dim)


def get_inputs():
    return [torch.rand(batch_size, length)]


def get_init_inputs():
    return [scan_dim]
