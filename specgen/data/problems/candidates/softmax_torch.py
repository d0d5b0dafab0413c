# problem: softmax
# kind: honest
# lang: torch
"""Softmax in plain PyTorch: subtract the row max, exponentiate in place, divide by the row sum."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shifted = x - x.amax(dim=-1, keepdim=True)
        shifted.exp_()
        return shifted.div_(shifted.sum(dim=-1, keepdim=True))
