"""3x3 convolution with bias ("same" padding, stride 1) followed by ReLU (KernelBench level 2
style).

Kind: conv. x is (batch_size, in_channels, height, width); the output is
(batch_size, out_channels, height, width). On a GPU the reference convolution runs in exact fp32
(cuDNN's TF32 off for that call), like every other fp32 reference here.
Sizes: GPU-sized by default; SPECGEN_PROBLEM_SCALE=small gives a CPU-sized instance.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 2 if SMALL else 32
in_channels = 8 if SMALL else 64
out_channels = 16 if SMALL else 128
height = 16 if SMALL else 64
width = 16 if SMALL else 64
kernel_size = 3


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            # Exact fp32, as the fp32 tolerance assumes: cuDNN's default TF32 convolutions are
            # about 1e-3 off. Scoped to this call; the process's settings are left as they are.
            with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled,
                                            benchmark=torch.backends.cudnn.benchmark,
                                            deterministic=torch.backends.cudnn.deterministic,
                                            allow_tf32=False):
                return torch.relu(self.conv(x))
        return torch.relu(self.conv(x))


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]


def get_flops():
    return 2 * batch_size * out_channels * height * width * in_channels * kernel_size ** 2
