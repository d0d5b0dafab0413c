# problem: softmax
# expect: error:device-side assert
"""Indexes out of bounds on the GPU: a device-side assert poisons the CUDA context."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        index = torch.tensor([x.shape[0] + 10**6], device=x.device)
        return torch.softmax(x, dim=-1)[index]
