# problem: add_mul_tanh
# device: any
# expect: correct
# pattern: torch.compile of a plain torch function (inductor fuses the elementwise chain)
import torch
import torch.nn as nn


def fused_add_mul_tanh(x, y, scale):
    return torch.tanh((x + y) * scale)


compiled_add_mul_tanh = torch.compile(fused_add_mul_tanh)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return compiled_add_mul_tanh(x, y, self.scale)
