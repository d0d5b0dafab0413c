# problem: conv2d_bias_relu
# kind: honest
# lang: torch
"""Conv2d + bias + ReLU in plain PyTorch: one conv2d call with the bias (exact fp32 on a GPU, as
the reference), then the ReLU in place on its output (no second output tensor)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            # exact fp32 (cuDNN would use TF32 by default), scoped to this call
            with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled,
                                            benchmark=torch.backends.cudnn.benchmark,
                                            deterministic=torch.backends.cudnn.deterministic,
                                            allow_tf32=False):
                return self._conv_relu(x)
        return self._conv_relu(x)

    def _conv_relu(self, x: torch.Tensor) -> torch.Tensor:
        out = F.conv2d(x, self.conv.weight, self.conv.bias, padding=self.conv.padding)
        return out.relu_()
