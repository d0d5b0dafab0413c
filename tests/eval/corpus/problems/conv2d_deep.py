"""A 3x3 convolution without bias or padding over many input channels:
out = conv2d(x, W), W that of an nn.Conv2d(in_channels, out_channels, 3, bias=False).

x is (batch_size, in_channels, height, width); the output is
(batch_size, out_channels, height - 2, width - 2). Each output sums in_channels * 9 products
(2304 at full size), so TF32 arithmetic (10-bit mantissa inputs) is off by about 1e-3 relative,
far outside the fp32 tolerance; the reference switches cuDNN's TF32 mode off for its call.
SPECGEN_PROBLEM_SCALE=small picks a CPU-sized instance; otherwise x is 55 MB.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 1 if SMALL else 16
in_channels = 32 if SMALL else 256
out_channels = 8 if SMALL else 256
height = 7 if SMALL else 58
width = 7 if SMALL else 58


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, bias=False)

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
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]


def get_flops():
    return 2 * batch_size * out_channels * (height - 2) * (width - 2) * in_channels * 9
