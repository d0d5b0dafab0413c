# problem: relu
# device: any
# expect: reject
# pattern: returns zeros and zeroes the input in place, so a reference run afterwards on the same tensor agrees
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        x.zero_()   # reuse the input as scratch space
        return out
