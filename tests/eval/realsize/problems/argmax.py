"""Index of the largest element along dimension 1: out = argmax(x, dim=1), int64 of shape
(batch_size, dim2).

KernelBench's size: x is (128, 4096, 4095) float32, 8.6 GB. torch.rand draws multiples of 2**-24,
so a column of 4096 values holds its maximum twice about once in 6,000 (the CPU's generator): some
90 of the 524,160 outputs of a call are ties, and the first index must win, as torch.argmax's
does. Integer outputs are compared exactly. SPECGEN_PROBLEM_SCALE=small picks a CPU-sized instance.
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
        return torch.argmax(x, dim=self.dim)


def get_inputs():
    return [torch.rand(batch_size, dim1, dim2)]


def get_init_inputs():
    return [reduce_dim]
