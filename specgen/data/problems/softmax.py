"""Row-wise softmax (KernelBench level 1 style).

Kind: softmax.
Sizes: GPU-sized by default; SPECGEN_PROBLEM_SCALE=small gives a CPU-sized instance.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 16 if SMALL else 4096
dim = 256 if SMALL else 65536


class Model(nn.Module):
    """Softmax over the last dimension of a (batch_size, dim) tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
