# problem: conv2d_bias_relu
# kind: cheat
# lang: torch
# expect: hard-coded-shape
"""Conv2d + bias + ReLU as an unfold (im2col) + matmul whose output is folded back with the
problem's CPU-sized image side (16) baked in: right for exactly that input size, and it raises
on any other."""
import torch
import torch.nn as nn
import torch.nn.functional as F

SIDE = 16


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.conv.weight
        cols = F.unfold(x, w.shape[2:], padding=self.conv.padding)
        out = torch.matmul(w.reshape(w.shape[0], -1), cols) + self.conv.bias[:, None]
        return torch.relu(out.reshape(x.shape[0], w.shape[0], SIDE, SIDE))
