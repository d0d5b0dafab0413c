# problem: softmax
# expect: reject
"""Caches the output under the input's data pointer (looked up through getattr so that a source
scan does not see `data_ptr`): the same buffer refilled with new values returns a stale result."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.last_key = None
        self.last_out = None

    def forward(self, x):
        key = (getattr(x, "data_" + "ptr")(), tuple(x.shape))
        if key == self.last_key:
            return self.last_out.clone()
        out = torch.softmax(x, dim=-1)
        self.last_key, self.last_out = key, out.clone()
        return out
