# problem: softmax
# expect: hard-coded-shape
"""A Triton softmax with the problem's row count and row length baked in as constants."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

ROWS = 16
COLS = 256


@triton.jit
def softmax_fixed(x_ptr, y_ptr, COLS: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, COLS)
    x = tl.load(x_ptr + row * COLS + offs)
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(y_ptr + row * COLS + offs, e / tl.sum(e, axis=0))


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.zeros(ROWS, COLS, device=x.device)
        softmax_fixed[(ROWS,)](x, y, COLS=COLS)
        return y
