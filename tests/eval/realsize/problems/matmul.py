"""Matrix product: out = A @ B, A (M, K), B (K, N), float32.

KernelBench's size: M = 2048, K = 8192, N = 4096 (A 67 MB, B 134 MB, 137 GFLOP). Inputs from
torch.rand, so each output sums 8192 products in [0, 1) and is about 2048. The reference runs with
PyTorch's default float32 matmul precision (no TF32). With all products positive, TF32's rounding
errors largely cancel: on an H100 a TF32 product's largest error was 0.155 against a tolerance of
about 0.2 there. SPECGEN_PROBLEM_SCALE=small picks a CPU-sized instance.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
M = 24 if SMALL else 2048
K = 40 if SMALL else 8192
N = 20 if SMALL else 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.rand(M, K), torch.rand(K, N)]


def get_init_inputs():
    return []


def get_flops():
    return 2 * M * K * N
