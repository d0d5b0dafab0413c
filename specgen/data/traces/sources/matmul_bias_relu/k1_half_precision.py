"""First attempt: the same linear + ReLU in half precision (tensor cores), cast back to fp32.

Wrong on purpose in the trace: fp16 inputs and accumulation lose about three decimal digits, far
more than the 1e-4 tolerance of an fp32 problem.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.linear.weight, self.linear.bias
        return F.relu(F.linear(x.half(), w.half(), b.half())).float()
