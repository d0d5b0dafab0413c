# problem: softmax
# expect: tensor-subclass
"""Returns a tensor subclass that defers the softmax until someone looks at the values."""
import torch
import torch.nn as nn


class Deferred(torch.Tensor):
    pass


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1).as_subclass(Deferred)
