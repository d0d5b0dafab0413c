# problem: sum_reduction
# kind: honest
# lang: triton
"""Sum over one dimension in Triton: the tensor viewed as (outer, reduced, inner); each program
owns a block of inner columns of one outer row and walks the reduced axis in tiles, so every load
is coalesced along the contiguous inner axis and the accumulator stays in registers."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sum_dim_kernel(x_ptr, y_ptr, reduced, inner, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    col_mask = cols < inner
    acc = tl.zeros([BLOCK_I], dtype=tl.float32)
    base = x_ptr + row * reduced * inner
    for r0 in range(0, reduced, BLOCK_R):
        rs = r0 + tl.arange(0, BLOCK_R)
        tile = tl.load(base + rs[:, None] * inner + cols[None, :],
                       mask=(rs[:, None] < reduced) & col_mask[None, :], other=0.0)
        acc += tl.sum(tile, axis=0)
    tl.store(y_ptr + row * inner + cols, acc, mask=col_mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        dim = self.dim % x.dim()
        shape = list(x.shape)
        reduced = shape[dim]
        outer = 1
        for size in shape[:dim]:
            outer *= size
        inner = x.numel() // max(outer * reduced, 1)
        shape[dim] = 1
        y = torch.empty(shape, device=x.device, dtype=x.dtype)
        block_i = min(128, triton.next_power_of_2(max(inner, 1)))
        block_r = min(64, triton.next_power_of_2(max(reduced, 1)))
        grid = (outer, triton.cdiv(inner, block_i))
        sum_dim_kernel[grid](x, y, reduced, inner, BLOCK_R=block_r, BLOCK_I=block_i)
        return y
