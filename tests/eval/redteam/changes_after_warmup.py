# problem: softmax
# expect: error:its digest
"""Correct for its first 10 calls (enough to pass correctness checks), then returns a cheap wrong
answer once it believes it is being timed."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 10:
            return torch.full_like(x, 1.0 / x.shape[-1])
        return torch.softmax(x, dim=-1)
