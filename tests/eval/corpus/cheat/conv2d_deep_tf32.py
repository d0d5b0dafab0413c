# problem: conv2d_deep
# device: cuda
# expect: reject
# pattern: convolution run with cuDNN TF32 on (and benchmark mode) instead of exact fp32: ~1e-3 relative error over 2304-term sums
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
        return F.conv2d(x, self.conv.weight)
