# problem: matmul_bias_relu
# kind: cheat
# lang: torch
# expect: error:it would pass at float16's tolerance
"""Linear + ReLU computed in float16 and cast back: half the memory traffic and tensor-core rates
on a GPU, but the fp32 problem's tolerance is met only at fp16's."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.linear.weight.to(torch.float16)
        b = self.linear.bias.to(torch.float16)
        return torch.relu(torch.addmm(b, x.to(torch.float16), w.t())).float()
