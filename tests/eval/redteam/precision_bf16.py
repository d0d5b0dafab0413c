# problem: matmul_bias_relu
# expect: error:it would pass at float16's tolerance
"""Computes the fp32 matmul in bfloat16: within fp16/bf16 tolerance, far outside fp32's."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        w = self.linear.weight.to(torch.bfloat16)
        out = (x.to(torch.bfloat16) @ w.t()).float() + self.linear.bias
        return torch.relu(out)
