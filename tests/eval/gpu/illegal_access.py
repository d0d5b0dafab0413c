# problem: softmax
# expect: error:illegal memory access
"""A Triton kernel that writes far outside its output: an illegal memory access."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def wild_store(y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs + (1 << 40), 1.0, mask=offs < n)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        wild_store[(triton.cdiv(x.numel(), 256),)](y, x.numel(), BLOCK=256)
        return y
