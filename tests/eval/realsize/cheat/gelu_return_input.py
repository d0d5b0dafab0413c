# problem: gelu
# device: cuda
# expect: reject
# pattern: returns the input tensor itself (no kernel, no allocation): on [0, 1) inputs GELU(x) is x times 0.5 to 0.84, and a harness that only checks shapes and dtypes sees the right ones
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x
