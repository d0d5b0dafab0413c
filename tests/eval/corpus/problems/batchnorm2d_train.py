"""BatchNorm2d in training mode: each channel is normalized with the mean and the biased
variance of the current batch (over batch, height and width), then scaled by the learnable
weight and shifted by the learnable bias; eps 1e-5. The running statistics are updated as a
side effect and are not part of the output. The module is never switched to eval mode.

x is (batch_size, num_features, height, width). SPECGEN_PROBLEM_SCALE=small picks a CPU-sized
instance; otherwise x is 128 MB.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 4 if SMALL else 32
num_features = 4 if SMALL else 64
height = 8 if SMALL else 128
width = 8 if SMALL else 128


class Model(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


def get_inputs():
    return [torch.randn(batch_size, num_features, height, width)]


def get_init_inputs():
    return [num_features]
