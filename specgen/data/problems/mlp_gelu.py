"""Two-layer MLP with an exact (erf) GELU between the layers: fc2(gelu(fc1(x))) (KernelBench
level 2 style).

Kind: mlp. x is (batch_size, in_features); the output is (batch_size, out_features).
Sizes: GPU-sized by default; SPECGEN_PROBLEM_SCALE=small gives a CPU-sized instance.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 16 if SMALL else 2048
in_features = 64 if SMALL else 2048
hidden_features = 128 if SMALL else 8192
out_features = 64 if SMALL else 2048


class Model(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.fc2 = nn.Linear(hidden_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, hidden_features, out_features]


def get_flops():
    return 2 * batch_size * hidden_features * (in_features + out_features)
