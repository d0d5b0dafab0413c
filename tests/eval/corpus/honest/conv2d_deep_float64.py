# problem: conv2d_deep
# device: any
# expect: correct
# pattern: convolution accumulated in float64 and cast back (no TF32 question, more accurate than the reference)
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.conv2d(x.to(torch.float64), self.conv.weight.to(torch.float64))
        return out.to(x.dtype)
