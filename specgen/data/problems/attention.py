"""Scaled dot-product attention without a mask: softmax(Q K^T / sqrt(d)) V, written out as
matmul, scale, softmax, matmul (KernelBench level 1 style).

Kind: attention. q, k and v are (batch_size, heads, seq_len, head_dim); so is the output.
Sizes: GPU-sized by default; SPECGEN_PROBLEM_SCALE=small gives a CPU-sized instance.
"""
import math
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 2 if SMALL else 16
heads = 4 if SMALL else 16
seq_len = 32 if SMALL else 1024
head_dim = 32 if SMALL else 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        return torch.matmul(torch.softmax(scores, dim=-1), v)


def get_inputs():
    shape = (batch_size, heads, seq_len, head_dim)
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return []


def get_flops():
    return 4 * batch_size * heads * seq_len * seq_len * head_dim
