# problem: layernorm
"""Keeps the affine parameters flattened (same elements, different view): they line up with the
reference's element for element."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.normalized_shape = tuple(normalized_shape)
        n = 1
        for size in self.normalized_shape:
            n *= size
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n))

    def forward(self, x):
        rows = x.reshape(x.shape[0], -1)
        var, mean = torch.var_mean(rows, dim=1, keepdim=True, unbiased=False)
        out = (rows - mean) * torch.rsqrt(var + 1e-5) * self.weight + self.bias
        return out.reshape(x.shape)
