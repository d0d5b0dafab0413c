"""One program per row again, now walking the row 256 elements at a time.

Correct, and less wasteful than 32-element steps, but each program still has one chunk in flight
at a time, so the memory system stays far from busy: slower than the flat kernel.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_gelu_sigmoid_kernel(x_ptr, y_ptr, bias_ptr, out_ptr, dim, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    for start in range(0, dim, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < dim
        x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0)
        y = tl.load(y_ptr + row * dim + cols, mask=mask, other=0.0)
        b = tl.load(bias_ptr + cols, mask=mask, other=0.0)
        h = x + b
        gelu = 0.5 * h * (1.0 + tl.erf(h * 0.7071067811865476))
        sig = 1.0 / (1.0 + tl.exp(-y))
        tl.store(out_ptr + row * dim + cols, gelu * sig, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = x.contiguous(), y.contiguous()
        out = torch.empty_like(x)
        rows, dim = x.shape
        row_gelu_sigmoid_kernel[(rows,)](x, y, self.bias, out, dim, BLOCK=256)
        return out
