"""2-D convolution with bias ("same" padding, stride 1) followed by ReLU:
out = relu(conv2d(x, W, b, padding=kernel_size // 2)), W and b those of an nn.Conv2d.

x is (batch_size, in_channels, height, width); the output is
(batch_size, out_channels, height, width). On a GPU the reference convolution is computed in
exact fp32: cuDNN's TF32 mode (on by default for convolutions) is switched off for the call and
switched back afterwards. SPECGEN_PROBLEM_SCALE=small picks a CPU-sized instance; otherwise x is
64 MB.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 2 if SMALL else 16
in_channels = 3 if SMALL else 64
out_channels = 4 if SMALL else 64
height = 10 if SMALL else 128
width = 12 if SMALL else 128
kernel_size = 3


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda:
            return torch.relu(self.conv(x))
        saved = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        try:
            return torch.relu(self.conv(x))
        finally:
            torch.backends.cudnn.allow_tf32 = saved


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]


def get_flops():
    return 2 * batch_size * out_channels * height * width * in_channels * kernel_size ** 2
