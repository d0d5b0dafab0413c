# problem: softmax
# expect: honest-speed 0.5
"""Does its work (the softmax three times and 2 ms more: a slow kernel, honestly at most 1/3 of the
reference's speed on a GPU, where the sleep overlaps the device's work, and below 0.5x on the CPU
while the reference takes under 1 ms) while its runner makes the inputs, before the runner tells
the judge they are made (a timed call's first window), so the call itself only hands the result
back."""
import time

import torch
import torch.nn as nn

import specgen.eval.calls as calls

_inputs = calls.ProblemModule.inputs
_done: dict = {}


def _inputs_and_work(self, seed, shape):
    made = _inputs(self, seed, shape)
    _done.clear()
    out = torch.empty_like(made[0])
    for _ in range(3):              # three times the reference's work, whatever the device
        torch.softmax(made[0], dim=-1, out=out)
    _done[made[0].data_ptr()] = out
    time.sleep(0.002)               # the rest of a slow kernel's work
    return made


calls.ProblemModule.inputs = _inputs_and_work


class ModelNew(nn.Module):
    def forward(self, x):
        out = _done.pop(x.data_ptr(), None)
        return out if out is not None else torch.softmax(x, dim=-1)
