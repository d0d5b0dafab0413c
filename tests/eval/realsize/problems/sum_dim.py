"""Sum over one dimension: out = x.sum(dim=reduce_dim, keepdim=True), reduce_dim = 1.

KernelBench's size: x is (128, 4096, 4095) float32, 8.6 GB; the output is (128, 1, 4095). The
reduced elements of one output lie 4095 apart, an odd stride: no row of x starts 16-byte aligned.
SPECGEN_PROBLEM_SCALE=small picks a CPU-sized instance.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 4 if SMALL else 128
dim1 = 24 if SMALL else 4096
dim2 = 40 if SMALL else 4095
reduce_dim = 1


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


def get_inputs():
    return [torch.rand(batch_size, dim1, dim2)]


def get_init_inputs():
    return [reduce_dim]
