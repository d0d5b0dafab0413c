# problem: fused_elementwise
"""Imports Triton optionally (try/except around an import is not a fallback path) and uses a
tanh-free exact GELU in PyTorch."""
import math

import torch
import torch.nn as nn

try:
    import triton  # noqa: F401
except ImportError:
    triton = None


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x, y):
        h = x + self.bias
        gelu = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
        return gelu * torch.sigmoid(y)
