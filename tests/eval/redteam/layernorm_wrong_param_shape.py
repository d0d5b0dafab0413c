# problem: layernorm
# expect: parameter-mismatch
"""LayerNorm whose weight and bias have the last dimension's shape instead of the normalized
shape: at their initial values (ones, zeros) broadcasting gives the reference's output."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.normalized_shape = tuple(normalized_shape)
        self.weight = nn.Parameter(torch.ones(self.normalized_shape[-1]))
        self.bias = nn.Parameter(torch.zeros(self.normalized_shape[-1]))

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape) * self.weight + self.bias
