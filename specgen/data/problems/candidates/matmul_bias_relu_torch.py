# problem: matmul_bias_relu
# kind: honest
# lang: torch
"""Linear + ReLU in plain PyTorch: one addmm with the bias, then an in-place clamp."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.addmm(self.linear.bias, x, self.linear.weight.t())
        return out.clamp_min_(0.0)
