"""RMS normalization over dimension 1 (the features) of a 4-D tensor, no weight:
out = x / sqrt(mean(x ** 2, dim=1) + eps), eps 1e-5.

KernelBench's size: x is (112, 64, 512, 512) float32, 7.5 GB; each output element divides by the
root mean square of the 64 values at its (batch, row, column), which lie 262,144 elements apart
in memory. SPECGEN_PROBLEM_SCALE=small picks a CPU-sized instance.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 2 if SMALL else 112
features = 8 if SMALL else 64
dim1 = 6 if SMALL else 512
dim2 = 10 if SMALL else 512


class Model(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + self.eps)
        return x / rms


def get_inputs():
    return [torch.rand(batch_size, features, dim1, dim2)]


def get_init_inputs():
    return [features]
