"""Index of the largest element of each row: out = argmax(x, dim=1), an int64 tensor of shape
(batch_size,). On ties the first index wins (random inputs have none in practice).

x is (batch_size, dim). SPECGEN_PROBLEM_SCALE=small picks a CPU-sized instance; otherwise x is
128 MB.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 16 if SMALL else 4096
dim = 300 if SMALL else 8192


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.argmax(x, dim=1)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
