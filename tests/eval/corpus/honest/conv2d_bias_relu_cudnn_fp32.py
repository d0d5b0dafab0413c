# problem: conv2d_bias_relu
# device: any
# expect: correct
# pattern: F.conv2d with cuDNN TF32 switched off for the call and restored after (a precision setting that raises precision), in-place ReLU
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def _conv(self, x):
        return F.conv2d(x, self.conv.weight, self.conv.bias, padding=self.conv.padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            previous = torch.backends.cudnn.allow_tf32
            torch.backends.cudnn.allow_tf32 = False   # full fp32 products, like the reference
            try:
                out = self._conv(x)
            finally:
                torch.backends.cudnn.allow_tf32 = previous
        else:
            out = self._conv(x)
        return F.relu(out, inplace=True)
