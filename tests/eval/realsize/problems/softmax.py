"""Row-wise softmax over the last dimension of a (batch_size, dim) float32 tensor.

KernelBench's size: 4096 rows of 393,216 columns, x 6.4 GB. Inputs come from torch.rand, so each
output is between about 1.5e-6 and 4.0e-6: every value lies below the absolute tolerance (1e-4),
and only a relative check tells a right row from a constant. SPECGEN_PROBLEM_SCALE=small picks a
CPU-sized instance.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 16 if SMALL else 4096
dim = 256 if SMALL else 393216


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
