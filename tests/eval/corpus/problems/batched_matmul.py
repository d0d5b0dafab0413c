"""Batched matrix multiply: out[i] = a[i] @ b[i].

a is (batch_size, m, k), b is (batch_size, k, n); the output is (batch_size, m, n).
SPECGEN_PROBLEM_SCALE=small picks a CPU-sized instance; otherwise a and b are 64 MB each.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 2 if SMALL else 32
m = 24 if SMALL else 1024
k = 32 if SMALL else 512
n = 20 if SMALL else 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


def get_inputs():
    return [torch.randn(batch_size, m, k), torch.randn(batch_size, k, n)]


def get_init_inputs():
    return []


def get_flops():
    return 2 * batch_size * m * k * n
