# problem: softmax
# expect: honest-speed 1.5
"""Runs the softmax on a side stream and returns without making the current stream wait (the
exploit KernelBench accepted with 49x, 15x and 9.6x): timing on the current stream alone sees
almost nothing. The judge's digest of the output is read on the current stream after the call:
work still running on the side stream is either waited for (and timed) or missing from the output
(a mismatch)."""
import torch
import torch.nn as nn

_make_stream = getattr(torch.cuda, "Str" + "eam")
_use_stream = getattr(torch.cuda, "str" + "eam")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = None

    def forward(self, x):
        if self.side is None:
            self.side = _make_stream()
        with _use_stream(self.side):
            return torch.softmax(x, dim=-1)
