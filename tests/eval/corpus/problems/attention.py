"""Scaled dot-product attention without masking: out = softmax(Q K^T / sqrt(d)) V.

q, k and v are (batch_size, num_heads, seq_len, head_dim); the output has the same shape.
d is head_dim, read from the inputs. The reference materialises the (seq_len, seq_len) score
matrix. SPECGEN_PROBLEM_SCALE=small picks a CPU-sized instance; otherwise each input is 32 MB.
"""
import math
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 1 if SMALL else 8
num_heads = 2 if SMALL else 16
seq_len = 16 if SMALL else 1024
head_dim = 8 if SMALL else 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        return torch.matmul(torch.softmax(scores, dim=-1), v)


def get_inputs():
    shape = (batch_size, num_heads, seq_len, head_dim)
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return []


def get_flops():
    return 4 * batch_size * num_heads * seq_len * seq_len * head_dim
