# problem: fused_elementwise
# kind: slow
# lang: torch
"""gelu(x + bias) * sigmoid(y) one row at a time in a Python loop, with the GELU and the sigmoid
written out as separate elementary operations: correct, but about a dozen operator calls and
temporaries per row."""
import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        rows = []
        for xr, yr in zip(x.unbind(0), y.unbind(0)):
            h = xr + self.bias
            gelu = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
            sigmoid = 1.0 / (1.0 + torch.exp(-yr))
            rows.append(gelu * sigmoid)
        return torch.stack(rows)
