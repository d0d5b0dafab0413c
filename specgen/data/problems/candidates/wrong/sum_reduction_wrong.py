# problem: sum_reduction
# kind: wrong
# lang: triton
"""Sum over one dimension in Triton with an off-by-one: the loop over the reduced axis starts
at 1, so the first slice is never added."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sum_dim_kernel(x_ptr, y_ptr, reduced, inner, BLOCK_I: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = cols < inner
    acc = tl.zeros([BLOCK_I], dtype=tl.float32)
    for r in range(1, reduced):
        acc += tl.load(x_ptr + (row * reduced + r) * inner + cols, mask=mask, other=0.0)
    tl.store(y_ptr + row * inner + cols, acc, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        dim = self.dim % x.dim()
        shape = list(x.shape)
        reduced = shape[dim]
        inner = 1
        for size in shape[dim + 1:]:
            inner *= size
        outer = x.numel() // max(reduced * inner, 1)
        shape[dim] = 1
        y = torch.empty(shape, device=x.device, dtype=x.dtype)
        block = min(128, triton.next_power_of_2(max(inner, 1)))
        sum_dim_kernel[(outer, triton.cdiv(inner, block))](x, y, reduced, inner, BLOCK_I=block)
        return y
