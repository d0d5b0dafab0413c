"""The flat fused kernel with 4096 elements a program and 8 warps, loads marked streaming.

Wider programs keep more bytes in flight per SM (the kernel is memory-bound), and
eviction_policy="evict_first" keeps the streamed x and y from pushing the reused bias out of L2.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def fused_gelu_sigmoid_kernel(x_ptr, y_ptr, bias_ptr, out_ptr, n, dim, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first")
    y = tl.load(y_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first")
    b = tl.load(bias_ptr + offs % dim, mask=mask, other=0.0, eviction_policy="evict_last")
    h = x + b
    gelu = 0.5 * h * (1.0 + tl.erf(h * 0.7071067811865476))
    sig = 1.0 / (1.0 + tl.exp(-y))
    tl.store(out_ptr + offs, gelu * sig, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = x.contiguous(), y.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        grid = (triton.cdiv(n, 4096),)
        fused_gelu_sigmoid_kernel[grid](x, y, self.bias, out, n, x.shape[-1], BLOCK=4096,
                                        num_warps=8)
        return out
