# problem: softmax
# device: cuda
# expect: correct
# pattern: Triton softmax over 393,216-column rows: one program per row, an online max and rescaled sum per lane over column chunks, then a second pass that writes exp(x - max) / sum
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_row_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = row * n_cols
    offs = tl.arange(0, BLOCK)
    # Each lane keeps its own running maximum and the sum of exp(x - that maximum): a row this
    # long does not fit in one block, and a lane-wise sum of ~100 terms per lane followed by one
    # tree sum keeps float32 error far below the tolerance.
    run_max = tl.full([BLOCK], -float("inf"), tl.float32)
    run_sum = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        x = tl.load(x_ptr + base + cols, mask=cols < n_cols, other=-float("inf"))
        new_max = tl.maximum(run_max, x)
        # A lane that has seen only padding has new_max = -inf: exp(-inf - -inf) would be NaN.
        seen = new_max > -float("inf")
        safe_max = tl.where(seen, new_max, 0.0)
        run_sum = run_sum * tl.exp(run_max - safe_max) + tl.where(seen, tl.exp(x - safe_max), 0.0)
        run_max = new_max
    row_max = tl.max(run_max, axis=0)
    lane_sum = tl.where(run_max > -float("inf"), run_sum * tl.exp(run_max - row_max), 0.0)
    total = tl.sum(lane_sum, axis=0)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(x_ptr + base + cols, mask=mask, other=-float("inf"))
        tl.store(y_ptr + base + cols, tl.exp(x - row_max) / total, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n_cols = x.shape[-1]
        n_rows = x.numel() // n_cols if n_cols else 0
        y = torch.empty_like(x)
        if n_rows == 0:
            return y
        block = min(4096, triton.next_power_of_2(n_cols))
        softmax_row_kernel[(n_rows,)](x, y, n_cols, BLOCK=block, num_warps=8)
        return y
