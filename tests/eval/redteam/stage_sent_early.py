# problem: softmax
# expect: error:to a timed call
"""Tells the judge its call returned before its inputs are even made (a timed call's stage
messages out of order), hoping the windows come out in its favour."""
import torch
import torch.nn as nn

import specgen.eval.calls as calls

_run_trial = calls.run_trial


def _early(problem, call, trial, null_like=None, mark=None):
    if mark is not None:
        mark("called")
    return _run_trial(problem, call, trial, null_like, mark)


calls.run_trial = _early


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
