# problem: softmax
# expect: mutated-inputs
"""Returns the right result but zeroes its input afterwards (a later call could then be cheap)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.softmax(x, dim=-1)
        x.zero_()
        return out
