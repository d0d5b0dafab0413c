# problem: conv2d_bias_relu
# device: any
# expect: correct
# pattern: convolution as im2col (F.unfold) + matmul, bias added and ReLU applied in place on the result
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        k = self.conv.kernel_size[0]
        pad = self.conv.padding[0]
        out_h = h + 2 * pad - k + 1
        out_w = w + 2 * pad - k + 1
        cols = F.unfold(x, kernel_size=k, padding=pad)                 # (n, c*k*k, out_h*out_w)
        weight = self.conv.weight.reshape(self.conv.out_channels, -1)  # (o, c*k*k)
        out = torch.matmul(weight, cols)                               # (n, o, out_h*out_w)
        out += self.conv.bias.view(1, -1, 1)
        out = out.view(n, self.conv.out_channels, out_h, out_w)
        return out.relu_()
