# problem: layernorm
# device: any
# expect: correct
# pattern: statistics and normalization accumulated in float64, cast back to the input dtype (more accurate than the fp32 reference)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x64 = x.to(torch.float64)
        mean = x64.mean(dim=-1, keepdim=True)
        centered = x64 - mean
        var = (centered * centered).mean(dim=-1, keepdim=True)
        y = centered * torch.rsqrt(var + self.eps)
        y = y * self.weight.to(torch.float64) + self.bias.to(torch.float64)
        return y.to(x.dtype)
