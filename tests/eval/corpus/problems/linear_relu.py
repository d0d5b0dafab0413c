"""GEMM with bias followed by ReLU: out = relu(x @ W^T + b), W and b those of an nn.Linear.

x is (batch_size, in_features); the output is (batch_size, out_features). On a GPU the
reference matmul runs in exact fp32 (PyTorch's default: TF32 off for matmul).
SPECGEN_PROBLEM_SCALE=small picks a CPU-sized instance; otherwise x and W are 64 MB each.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 16 if SMALL else 4096
in_features = 48 if SMALL else 4096
out_features = 40 if SMALL else 4096


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]


def get_flops():
    return 2 * batch_size * in_features * out_features
