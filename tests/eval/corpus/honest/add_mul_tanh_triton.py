# problem: add_mul_tanh
# device: any
# expect: correct
# pattern: fused Triton kernel (add, per-column scale, tanh) with tanh from exp(-2|h|), a stable form
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_mul_tanh_kernel(x_ptr, y_ptr, scale_ptr, out_ptr, n_elements, n_cols,
                        BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0)
    s = tl.load(scale_ptr + offsets % n_cols, mask=mask, other=0.0)
    h = (x + y) * s
    # tanh(h) = sign(h) * (1 - e) / (1 + e), e = exp(-2|h|): no overflow for large |h|
    e = tl.exp(-2.0 * tl.abs(h))
    t = (1.0 - e) / (1.0 + e)
    t = tl.where(h < 0, -t, t)
    tl.store(out_ptr + offsets, t, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = y.contiguous()
        scale = self.scale.detach().contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        if n == 0:
            return out
        BLOCK_SIZE = 1024
        grid = (triton.cdiv(n, BLOCK_SIZE),)
        add_mul_tanh_kernel[grid](x, y, scale, out, n, scale.numel(), BLOCK_SIZE=BLOCK_SIZE)
        return out
