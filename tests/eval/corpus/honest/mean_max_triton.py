# problem: mean_max
# device: any
# expect: correct
# pattern: one Triton pass per row producing both outputs of a tuple (running sum and running max over chunks)
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def mean_max_kernel(x_ptr, mean_ptr, max_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * n_cols
    lanes = tl.arange(0, BLOCK)
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    best = tl.full((BLOCK,), -float("inf"), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + lanes
        mask = cols < n_cols
        v = tl.load(base + cols, mask=mask, other=0.0)
        total += v
        best = tl.maximum(best, tl.where(mask, v, -float("inf")))
    tl.store(mean_ptr + row, tl.sum(total, axis=0) / n_cols)
    tl.store(max_ptr + row, tl.max(best, axis=0))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor):
        x = x.contiguous()
        rows, cols = x.shape
        mean = torch.empty(rows, device=x.device, dtype=x.dtype)
        top = torch.empty(rows, device=x.device, dtype=x.dtype)
        if rows == 0:
            return mean, top
        BLOCK = min(1024, triton.next_power_of_2(cols))
        mean_max_kernel[(rows,)](x, mean, top, cols, BLOCK=BLOCK)
        return mean, top
