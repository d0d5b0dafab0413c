# problem: softmax
# expect: honest-speed 1.5
"""Reaches the problem's module and shrinks its input sizes, so that get_inputs() would build small
inputs that this candidate can then handle cheaply. Inputs are made in the reference runner, whose
module it cannot reach: it does the honest work on full-sized inputs and gains nothing."""
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
