"""Layer normalization over the last three dimensions (KernelBench level 1 style).

Kind: normalization.
The normalized shape is (features, dim1, dim2): a candidate's weight and bias must have that
shape too (at their initial values, ones and zeros, a wrongly shaped pair gives the same output).
Sizes: GPU-sized by default; SPECGEN_PROBLEM_SCALE=small gives a CPU-sized instance.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 4 if SMALL else 16
features = 4 if SMALL else 64
dim1 = 8 if SMALL else 256
dim2 = 8 if SMALL else 256


class Model(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


def get_inputs():
    x = torch.randn(batch_size, features, dim1, dim2)
    return [x]


def get_init_inputs():
    return [(features, dim1, dim2)]
