# problem: fused_elementwise
# kind: honest
# lang: triton
"""gelu(x + bias) * sigmoid(y) as one Triton kernel: each element read once, written once."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def fused_kernel(x_ptr, y_ptr, bias_ptr, out_ptr, n, dim, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    b = tl.load(bias_ptr + offs % dim, mask=mask, other=0.0)
    h = x + b
    gelu = 0.5 * h * (1.0 + tl.erf(h * 0.7071067811865476))
    tl.store(out_ptr + offs, gelu * (1.0 / (1.0 + tl.exp(-y))), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = x.contiguous(), y.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        fused_kernel[(triton.cdiv(n, 1024),)](x, y, self.bias, out, n, x.shape[-1], BLOCK=1024)
        return out
