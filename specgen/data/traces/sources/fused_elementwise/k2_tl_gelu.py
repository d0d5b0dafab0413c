"""A fused Triton kernel that calls a GELU that triton.language does not have: it fails to compile."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def fused_gelu_sigmoid_kernel(x_ptr, y_ptr, bias_ptr, out_ptr, n, dim, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    b = tl.load(bias_ptr + offs % dim, mask=mask)
    out = tl.gelu(x + b) * tl.sigmoid(y)
    tl.store(out_ptr + offs, out, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        fused_gelu_sigmoid_kernel[(triton.cdiv(n, 1024),)](x, y, self.bias, out, n, x.shape[-1],
                                                           BLOCK=1024)
        return out
