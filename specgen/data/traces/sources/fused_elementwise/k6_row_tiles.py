"""A 2-D grid (row, column tile of 128): no integer modulo for the bias, loaded once a tile.

Correct, but tiles of 128 elements are small for a memory-bound kernel: more programs, fewer
bytes in flight each, so it is not faster than the flat kernel.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def tiled_gelu_sigmoid_kernel(x_ptr, y_ptr, bias_ptr, out_ptr, dim, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < dim
    b = tl.load(bias_ptr + cols, mask=mask, other=0.0)
    x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0)
    y = tl.load(y_ptr + row * dim + cols, mask=mask, other=0.0)
    h = x + b
    gelu = 0.5 * h * (1.0 + tl.erf(h * 0.7071067811865476))
    sig = 1.0 / (1.0 + tl.exp(-y))
    tl.store(out_ptr + row * dim + cols, gelu * sig, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = x.contiguous(), y.contiguous()
        out = torch.empty_like(x)
        rows, dim = x.shape
        grid = (rows, triton.cdiv(dim, 128))
        tiled_gelu_sigmoid_kernel[grid](x, y, self.bias, out, dim, BLOCK_N=128)
        return out
