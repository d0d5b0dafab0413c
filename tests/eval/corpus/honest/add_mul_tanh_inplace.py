# problem: add_mul_tanh
# device: any
# expect: correct
# pattern: in-place ops on an intermediate the candidate allocated itself (add, then mul_ and tanh_)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.add(x, y)      # new tensor: the inputs are left untouched
        h.mul_(self.scale)
        return h.tanh_()
