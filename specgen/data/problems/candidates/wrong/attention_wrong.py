# problem: attention
# kind: wrong
# lang: torch
"""Attention with the softmax taken over the query axis (dim=-2) instead of the key axis: each
column of weights sums to one instead of each row."""
import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        return torch.matmul(torch.softmax(scores, dim=-2), v)
