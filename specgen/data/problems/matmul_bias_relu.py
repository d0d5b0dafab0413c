"""Linear layer followed by ReLU: relu(x @ W.T + b) (KernelBench level 2 style).

Kind: matmul.
Sizes: GPU-sized by default; SPECGEN_PROBLEM_SCALE=small gives a CPU-sized instance.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 24 if SMALL else 4096
in_features = 64 if SMALL else 4096
out_features = 48 if SMALL else 4096


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
