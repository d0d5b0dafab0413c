# problem: softmax
# kind: slow
# lang: torch
"""Softmax computed one row at a time in a Python loop, in float64, then converted back:
correct, but a handful of small operator calls per row instead of one kernel."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = []
        for row in x.double().unbind(0):
            e = torch.exp(row - row.max())
            rows.append(e / e.sum())
        return torch.stack(rows).to(x.dtype)
