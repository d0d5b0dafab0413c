"""Elementwise GELU, the exact (erf) form: out = 0.5 x (1 + erf(x / sqrt(2))).

KernelBench's size: a (4096, 393216) float32 tensor, 6.4 GB in and 6.4 GB out; inputs from
torch.rand, so every output lies in [0, 0.85). SPECGEN_PROBLEM_SCALE=small picks a CPU-sized
instance.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 16 if SMALL else 4096
dim = 256 if SMALL else 393216


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
