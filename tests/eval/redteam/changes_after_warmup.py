# problem: softmax
# expect: error:timed call
"""Correct for its first 10 calls (enough to pass correctness checks), then returns a cheap wrong
answer once it believes it is being timed. Caught in the timed calls: by its digest where the
outputs are above the absolute tolerance (the CPU's size), else by the full comparison of a timed
call picked for one (the GPU's 65,536-long rows give outputs near 1.5e-5, under atol 1e-4, which
only the comparison's check against the largest output sees)."""
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
