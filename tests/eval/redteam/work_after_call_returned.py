# problem: softmax
# expect: honest-speed 0.5
"""Returns an empty output at once and does its work (the softmax three times and 2 ms more: a slow
kernel, honestly at most 1/3 of the reference's speed on a GPU, where the sleep overlaps the
device's work, and below 0.5x on the CPU while the reference takes under 1 ms) when its runner
digests the output, after the runner has told the judge the call returned (a timed call's last
window)."""
import time

import torch
import torch.nn as nn

import specgen.eval.calls as calls

_digests = calls.output_digests
_pending: list = []


def _fill_then_digest(leaves, *args, **kwargs):
    while _pending:
        x, out = _pending.pop()
        for _ in range(3):          # three times the reference's work, whatever the device
            torch.softmax(x, dim=-1, out=out)
        time.sleep(0.002)           # the rest of a slow kernel's work
    return _digests(leaves, *args, **kwargs)


calls.output_digests = _fill_then_digest


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        _pending.append((x, out))
        return out
