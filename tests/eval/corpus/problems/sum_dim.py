"""Sum reduction over one dimension: out = x.sum(dim=reduce_dim), reduce_dim = 1.

x is (batch_size, dim1, dim2); the output is (batch_size, dim2). SPECGEN_PROBLEM_SCALE=small
picks a CPU-sized instance; otherwise x is 128 MB.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 4 if SMALL else 32
dim1 = 24 if SMALL else 1024
dim2 = 40 if SMALL else 1024
reduce_dim = 1


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim)


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return [reduce_dim]
