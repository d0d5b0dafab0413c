"""2-D convolution without bias, padding or stride: out = conv2d(x, W), W that of an
nn.Conv2d(in_channels, out_channels, kernel_size, bias=False).

KernelBench's size: x is (16, 16, 1024, 1024) float32 (1.1 GB), a 3x3 kernel to 128 channels;
the output is (16, 128, 1022, 1022), 8.6 GB, 617 GFLOP. Each output sums 144 products of inputs
in [0, 1) and weights of both signs. cuDNN's default for float32 convolutions is TF32 (errors up to
6e-4 on an H100, where the tolerance is about 1.3e-4); the reference switches that off for its
call, so the problem is the float32 convolution.
SPECGEN_PROBLEM_SCALE=small picks a CPU-sized instance.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 1 if SMALL else 16
in_channels = 4 if SMALL else 16
out_channels = 8 if SMALL else 128
kernel_size = 3
height = 9 if SMALL else 1024
width = 11 if SMALL else 1024


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda:
            return self.conv(x)
        saved = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        try:
            return self.conv(x)
        finally:
            torch.backends.cudnn.allow_tf32 = saved


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]


def get_flops():
    out_h, out_w = height - kernel_size + 1, width - kernel_size + 1
    return 2 * batch_size * out_channels * out_h * out_w * in_channels * kernel_size ** 2
