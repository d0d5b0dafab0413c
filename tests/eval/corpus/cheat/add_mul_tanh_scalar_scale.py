# problem: add_mul_tanh
# device: any
# expect: reject
# pattern: parameter of the wrong shape (one scalar instead of a per-column vector): right only while every scale is still 1
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        # The scale starts as ones, so a single broadcast scalar gives the same result.
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.tanh((x + y) * self.scale)
