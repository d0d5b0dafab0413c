# problem: layernorm
# kind: honest
# lang: triton
"""LayerNorm in Triton: per-chunk partial sums (a grid over samples x chunks, so a few large
samples still fill the GPU), then a normalizing pass with the affine parameters."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def partial_sums_kernel(x_ptr, sums_ptr, n, n_chunks, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(sums_ptr + (row * n_chunks + chunk) * 2, tl.sum(x, axis=0))
    tl.store(sums_ptr + (row * n_chunks + chunk) * 2 + 1, tl.sum(x * x, axis=0))


@triton.jit
def normalize_kernel(x_ptr, w_ptr, b_ptr, y_ptr, stats_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    mean = tl.load(stats_ptr + row * 2)
    rstd = tl.load(stats_ptr + row * 2 + 1)
    x = tl.load(x_ptr + row * n + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + row * n + offs, (x - mean) * rstd * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.normalized_shape = tuple(normalized_shape)
        self.weight = nn.Parameter(torch.ones(self.normalized_shape))
        self.bias = nn.Parameter(torch.zeros(self.normalized_shape))
        self.eps = 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n = self.weight.numel()
        rows = x.numel() // n
        block = min(4096, triton.next_power_of_2(n))
        chunks = triton.cdiv(n, block)
        sums = torch.empty((rows, chunks, 2), device=x.device, dtype=torch.float32)
        partial_sums_kernel[(rows, chunks)](x, sums, n, chunks, BLOCK=block)
        totals = sums.double().sum(dim=1)
        mean = totals[:, 0] / n
        var = (totals[:, 1] / n - mean * mean).clamp_min(0.0)
        stats = torch.stack([mean, torch.rsqrt(var + self.eps)], dim=1).float().contiguous()
        y = torch.empty_like(x)
        normalize_kernel[(rows, chunks)](x, self.weight.contiguous(), self.bias.contiguous(), y,
                                         stats, n, BLOCK=block)
        return y
