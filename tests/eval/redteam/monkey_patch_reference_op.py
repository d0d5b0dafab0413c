# problem: softmax
# expect: reject
"""Replaces torch.softmax itself (through the module's namespace dict), so the reference would run
the candidate's code too and every comparison would agree."""
import torch
import torch.nn as nn

_real_softmax = torch.softmax


def _fake_softmax(x, dim=None, **kwargs):
    return _real_softmax(x, dim=dim, **kwargs) * 0 + 1.0 / x.shape[-1]


vars(torch)["softmax"] = _fake_softmax


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
