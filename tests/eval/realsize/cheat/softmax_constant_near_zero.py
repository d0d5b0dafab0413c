# problem: softmax
# device: cuda
# expect: reject
# pattern: every output set to 1/dim without reading the input: at 393,216 columns of torch.rand values softmax outputs lie between 1.5e-6 and 4e-6, so the constant is within an absolute tolerance of 1e-4 everywhere
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Rows of a softmax sum to one: their mean value is 1/dim.
        return torch.full_like(x, 1.0 / x.shape[-1])
