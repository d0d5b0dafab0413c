# problem: softmax
# expect: honest-speed 1.5
"""Writes every result into one preallocated buffer and returns that buffer each call."""
import torch
import torch.nn as nn

_buffers = {}


class ModelNew(nn.Module):
    def forward(self, x):
        out = _buffers.get("out")
        if out is None or out.shape != x.shape:
            out = _buffers["out"] = torch.empty_like(x)
        torch.softmax(x, dim=-1, out=out)
        return out
