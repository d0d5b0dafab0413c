# problem: softmax
# expect: error:NaN/Inf
"""Returns NaN everywhere (a comparison that treats NaN as equal would accept it)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.full_like(x, float("nan"))
