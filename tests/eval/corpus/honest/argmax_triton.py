# problem: argmax
# device: any
# expect: correct
# pattern: Triton argmax over row chunks: per-lane best value and index, strict '>' and a min-index merge keep the first maximum
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def argmax_rows_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * n_cols
    lanes = tl.arange(0, BLOCK)
    best_val = tl.full((BLOCK,), -float("inf"), dtype=tl.float32)
    best_idx = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(0, n_cols, BLOCK):
        cols = start + lanes
        v = tl.load(base + cols, mask=cols < n_cols, other=-float("inf"))
        better = v > best_val
        best_val = tl.where(better, v, best_val)
        best_idx = tl.where(better, cols, best_idx)
    top = tl.max(best_val, axis=0)
    first = tl.min(tl.where(best_val == top, best_idx, 2147483647), axis=0)
    tl.store(out_ptr + row, first.to(tl.int64))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.empty(rows, device=x.device, dtype=torch.int64)
        if rows == 0:
            return out
        BLOCK = min(1024, triton.next_power_of_2(cols))
        argmax_rows_kernel[(rows,)](x, out, cols, BLOCK=BLOCK)
        return out
