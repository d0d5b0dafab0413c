# problem: sum_dim
# device: any
# expect: correct
# pattern: Triton reduction over a middle dimension: the tensor seen as (outer, reduced, inner), coalesced column blocks
import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sum_middle_kernel(x_ptr, y_ptr, R, INNER, BLOCK: tl.constexpr):
    outer = tl.program_id(0).to(tl.int64)
    pid = tl.program_id(1)
    cols = pid * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INNER
    base = x_ptr + outer * R * INNER
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for r in range(0, R):
        acc += tl.load(base + r * INNER + cols, mask=mask, other=0.0)
    tl.store(y_ptr + outer * INNER + cols, acc, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        d = self.dim % x.dim()
        outer = math.prod(x.shape[:d])
        reduced = x.shape[d]
        inner = math.prod(x.shape[d + 1:])
        out_shape = x.shape[:d] + x.shape[d + 1:]
        y = torch.empty(out_shape, device=x.device, dtype=x.dtype)
        if outer == 0 or inner == 0:
            return y
        BLOCK = 128
        grid = (outer, triton.cdiv(inner, BLOCK))
        sum_middle_kernel[grid](x, y, reduced, inner, BLOCK=BLOCK)
        return y
