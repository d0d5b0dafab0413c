# problem: conv2d_bias_relu
# kind: wrong
# lang: torch
"""Conv2d + bias + ReLU computed as a true convolution (the filters flipped in both spatial
axes), where conv2d is a cross-correlation: right only for symmetric filters."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = torch.flip(self.conv.weight, dims=(2, 3))
        return F.relu(F.conv2d(x, weight, self.conv.bias, padding=self.conv.padding))
