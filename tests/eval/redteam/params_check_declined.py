# problem: layernorm
# expect: parameter-mismatch
"""LayerNorm whose forward never uses its parameters (right only at their initial values), and
whose runner answers the judge's request to load random parameters with an error of its own
choosing: before, the randomized-parameter trial was then skipped with a note and the model
accepted (1.0x, no flag)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import specgen.eval.runner as runner
from specgen.messages import ParamsSet


def _declined(self, request):
    return ParamsSet(error="loading parameters failed: RuntimeError: out of memory")


for _name in dir(runner):
    _role = getattr(runner, _name)
    if isinstance(_role, type) and hasattr(_role, "set_params"):
        _role.set_params = _declined


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.normalized_shape = tuple(normalized_shape)
        self.weight = nn.Parameter(torch.ones(self.normalized_shape))
        self.bias = nn.Parameter(torch.zeros(self.normalized_shape))

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape)
