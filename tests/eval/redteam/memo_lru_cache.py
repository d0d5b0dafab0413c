# problem: softmax
# expect: reject
"""Memoizes on the input's shape with functools.lru_cache."""
import functools

import torch
import torch.nn as nn

_inputs = {}


@functools.lru_cache(maxsize=None)
def _softmax_for(shape):
    return torch.softmax(_inputs["x"], dim=-1)


class ModelNew(nn.Module):
    def forward(self, x):
        _inputs["x"] = x
        return _softmax_for(tuple(x.shape)).clone()
