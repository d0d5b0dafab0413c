# problem: softmax
# expect: reject
"""Reaches the problem's module and shrinks its input sizes, so get_inputs() would build small
inputs that this candidate can then handle cheaply."""
import sys

import torch
import torch.nn as nn

for _name, _module in list(sys.modules.items()):
    if _name.startswith("specgen_problem"):
        _module.batch_size = 2
        _module.dim = 8


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
