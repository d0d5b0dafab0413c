"""Inclusive prefix sum along dimension 1: out[i, j] = sum(x[i, :j + 1]).

x is (batch_size, length); the output has the same shape. SPECGEN_PROBLEM_SCALE=small picks a
CPU-sized instance; otherwise x is 128 MB.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 8 if SMALL else 8192
length = 300 if SMALL else 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=1)


def get_inputs():
    return [torch.randn(batch_size, length)]


def get_init_inputs():
    return []
