# problem: rmsnorm
# device: any
# expect: correct
# pattern: optional import (try: import triton / except ImportError: triton = None); Triton is installed, so the kernel runs
import torch
import torch.nn as nn

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None
    tl = None


if triton is not None:
    @triton.jit
    def rmsnorm_kernel(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK_SIZE: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
        mean_sq = tl.sum(x * x, axis=0) / n_cols
        inv_rms = 1.0 / tl.sqrt(mean_sq + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        tl.store(y_ptr + row * n_cols + cols, x * inv_rms * w, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if triton is None:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        x = x.contiguous()
        n_cols = x.shape[-1]
        n_rows = x.numel() // n_cols
        y = torch.empty_like(x)
        if n_rows == 0:
            return y
        BLOCK_SIZE = triton.next_power_of_2(n_cols)
        rmsnorm_kernel[(n_rows,)](x, self.weight.detach(), y, n_cols, self.eps,
                                  BLOCK_SIZE=BLOCK_SIZE, num_warps=8 if BLOCK_SIZE >= 2048 else 4)
        return y
