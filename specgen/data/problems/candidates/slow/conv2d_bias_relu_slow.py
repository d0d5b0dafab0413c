# problem: conv2d_bias_relu
# kind: slow
# lang: torch
"""Conv2d + bias + ReLU as a sum over filter taps in a Python loop: for each (kh, kw) a shifted
view of the zero-padded input times that tap's (out, in) weight matrix (einsum), accumulated:
correct, but KH * KW separate products and accumulations instead of one convolution."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.conv.weight
        _, _, kh_size, kw_size = w.shape
        ph, pw = kh_size // 2, kw_size // 2
        _, _, height, width = x.shape
        padded = F.pad(x, (pw, pw, ph, ph))
        out = self.conv.bias.view(1, -1, 1, 1).expand(x.shape[0], -1, height, width).clone()
        for kh in range(kh_size):
            for kw in range(kw_size):
                window = padded[:, :, kh:kh + height, kw:kw + width]
                out = out + torch.einsum("bchw,oc->bohw", window, w[:, :, kh, kw])
        return torch.relu(out)
