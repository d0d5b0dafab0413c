# problem: cumsum
# device: any
# expect: correct
# pattern: Triton row scan in chunks: tl.cumsum inside a block plus a running carry between blocks
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def cumsum_rows_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = row * n_cols
    carry = 0.0
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        v = tl.load(x_ptr + base + cols, mask=mask, other=0.0)
        tl.store(y_ptr + base + cols, tl.cumsum(v, axis=0) + carry, mask=mask)
        carry += tl.sum(v, axis=0)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        if rows == 0 or cols == 0:
            return y
        BLOCK = min(1024, triton.next_power_of_2(cols))
        cumsum_rows_kernel[(rows,)](x, y, cols, BLOCK=BLOCK)
        return y
