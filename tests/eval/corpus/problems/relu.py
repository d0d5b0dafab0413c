"""Elementwise ReLU of a 2-D float32 tensor: out = max(x, 0).

x is (batch_size, dim); the output has the same shape. SPECGEN_PROBLEM_SCALE=small picks a
CPU-sized instance (4096 elements); otherwise x is 128 MB.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 16 if SMALL else 4096
dim = 256 if SMALL else 8192


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
