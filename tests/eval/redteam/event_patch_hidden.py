# problem: softmax
# expect: honest-speed 1.5
"""Replaces torch.cuda.Event.elapsed_time through the class's namespace (no attribute assignment
in the source): every measured time would be divided by ten."""
import torch
import torch.nn as nn

_events = vars(torch.cuda)["Event"]
_real = _events.elapsed_time
type.__setattr__(_events, "elapsed_time", lambda self, end: _real(self, end) / 10)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
