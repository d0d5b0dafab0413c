# problem: fused_elementwise
# kind: wrong
# lang: torch
"""gelu(x + bias) * sigmoid(y) with the bias added after the GELU instead of before it: right
where the bias is zero, wrong everywhere else."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (F.gelu(x) + self.bias) * torch.sigmoid(y)
