# problem: softmax
# expect: reject
"""Writes only the first half of the rows of an uninitialized output: the rest is whatever the
allocator hands out (the harness fills free blocks with NaN)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        half = x.shape[0] // 2
        out[:half] = torch.softmax(x[:half], dim=-1)
        return out
