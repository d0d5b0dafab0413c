# problem: matmul_bias_relu
# kind: slow
# lang: torch
"""Linear + ReLU as one matrix-vector product per input row in a Python loop: correct, but no
matrix-matrix product and one small kernel launch per row for each step."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.linear.weight, self.linear.bias
        rows = [torch.relu(torch.mv(w, row) + b) for row in x.unbind(0)]
        return torch.stack(rows)
