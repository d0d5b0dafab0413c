"""First attempt: plain PyTorch with the tanh approximation of GELU (cheaper than erf).

Wrong on purpose in the trace: the reference uses the exact (erf) GELU, and the tanh form differs
by up to ~5e-4, more than the 1e-4 tolerance.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # tanh-approximate GELU avoids erf
        return F.gelu(x + self.bias, approximate="tanh") * torch.sigmoid(y)
