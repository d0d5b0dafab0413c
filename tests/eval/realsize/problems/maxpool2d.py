"""2-D max pooling: out = max_pool2d(x, kernel_size=4, stride=1, padding=1, dilation=1).

KernelBench's size: x is (32, 64, 512, 512) float32, 2.1 GB; the output is (32, 64, 511, 511).
Padding counts as minus infinity, so border windows take the maximum of their real elements.
Outputs are copies of inputs: compared exactly in practice. SPECGEN_PROBLEM_SCALE=small picks a
CPU-sized instance.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 2 if SMALL else 32
channels = 3 if SMALL else 64
height = 10 if SMALL else 512
width = 12 if SMALL else 512
kernel_size = 4
stride = 1
padding = 1
dilation = 1


class Model(nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int, dilation: int):
        super().__init__()
        self.pool = nn.MaxPool2d(kernel_size=kernel_size, stride=stride, padding=padding,
                                 dilation=dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs():
    return [torch.rand(batch_size, channels, height, width)]


def get_init_inputs():
    return [kernel_size, stride, padding, dilation]
