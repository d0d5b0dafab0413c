# problem: fused_elementwise
# kind: honest
# lang: torch
"""gelu(x + bias) * sigmoid(y) in plain PyTorch with in-place steps (fewer temporaries)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = F.gelu(x + self.bias)
        return out.mul_(torch.sigmoid(y))
