# problem: conv2d
# device: cuda
# expect: reject
# pattern: cuDNN's TF32 mode and benchmark autotuning switched on around the convolution (the problem's own call switches TF32 off): tensor-core speed, about 1e-3 relative error over 144-term sums
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
        return F.conv2d(x, self.conv.weight)
