# problem: fused_elementwise
# expect: custom-kernel-not-run
"""Defines a Triton kernel but forward only ever calls PyTorch."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def fused_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)
        self.use_kernel = False

    def forward(self, x, y):
        if self.use_kernel:
            out = torch.empty_like(x)
            fused_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
            return out
        return F.gelu(x + self.bias) * torch.sigmoid(y)
