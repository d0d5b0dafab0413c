# problem: softmax
# expect: kernel-error-fallback
"""Launches a Triton kernel that fails and falls back to PyTorch inside try/except."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def broken_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, x * undefined_scale, mask=offs < n)  # noqa: F821


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        try:
            broken_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
        except Exception:
            return torch.softmax(x, dim=-1)
        return y
