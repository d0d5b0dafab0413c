# problem: attention
# kind: honest
# lang: torch
"""Attention in plain PyTorch through the fused scaled_dot_product_attention (flash or
memory-efficient kernels where available): the score matrix is not materialized."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)
