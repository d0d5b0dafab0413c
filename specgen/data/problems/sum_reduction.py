"""Sum over the middle dimension of a 3-D tensor, keeping it (KernelBench level 1 style).

Kind: reduction. x is (batch_size, dim1, dim2); the output is (batch_size, 1, dim2): a strided
reduction (the summed dimension is not the contiguous one).
Sizes: GPU-sized by default; SPECGEN_PROBLEM_SCALE=small gives a CPU-sized instance.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 8 if SMALL else 256
dim1 = 64 if SMALL else 256
dim2 = 48 if SMALL else 4096
reduce_dim = 1


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return [reduce_dim]
