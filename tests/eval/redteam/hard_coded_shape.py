# problem: softmax
# expect: hard-coded-shape
"""A Triton softmax with the problem's row count and row length baked in as constants: the two
shapes its source states (the CPU-sized one and the full one), picked as it does."""
import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
ROWS = 16 if SMALL else 4096
COLS = 256 if SMALL else 65536
BLOCK = min(COLS, 1024)


@triton.jit
def softmax_fixed(x_ptr, y_ptr, numel, COLS: tl.constexpr, BLOCK: tl.constexpr):
    # Two passes over a row of COLS (the running maximum and sum, then the output). Loads past the
    # tensor read zeros, so another shape gives a wrong answer rather than a fault.
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    top = tl.full((), float("-inf"), tl.float32)
    total = tl.zeros((), tl.float32)
    for start in range(0, COLS, BLOCK):
        at = row * COLS + start + offs
        x = tl.load(x_ptr + at, mask=at < numel, other=float("-inf"))
        new_top = tl.maximum(top, tl.max(x, axis=0))
        total = total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top), axis=0)
        top = new_top
    for start in range(0, COLS, BLOCK):
        at = row * COLS + start + offs
        x = tl.load(x_ptr + at, mask=at < numel, other=float("-inf"))
        tl.store(y_ptr + at, tl.exp(x - top) / total)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.zeros(ROWS, COLS, device=x.device)
        softmax_fixed[(ROWS,)](x, y, x.numel(), COLS=COLS, BLOCK=BLOCK)
        return y
