# problem: linear_relu
# device: any
# expect: reject
# pattern: weight stored transposed (in, out) with the same element count: right at the copied initial values, wrong once parameters are loaded by shape
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        init = nn.Linear(in_features, out_features)   # same initialisation as the reference
        # Keep W^T so the GEMM reads the weight row-major: y = x @ weight_t + bias.
        self.weight_t = nn.Parameter(init.weight.detach().t().contiguous())
        self.bias = nn.Parameter(init.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.addmm(self.bias, x, self.weight_t))
