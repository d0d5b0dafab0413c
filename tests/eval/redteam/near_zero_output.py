# problem: tiny_outputs
# expect: error:relative to the reference's magnitude
"""Returns zeros for an output whose values are all below the absolute tolerance."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)
