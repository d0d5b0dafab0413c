# problem: softmax
# expect: correct
"""Tries to shrink every memfd it holds (the arena's regions) to nothing, which would kill the
reference runner as it read past the end (a verdict that blames the reference), then does the
honest work: the regions are sealed, so the verdict is the honest one."""
import os

import torch
import torch.nn as nn


def _shrink() -> None:
    for name in os.listdir("/proc/self/fd"):
        try:
            if "memfd" in os.readlink(f"/proc/self/fd/{name}"):
                os.ftruncate(int(name), 0)
        except OSError:
            pass


class ModelNew(nn.Module):
    def forward(self, x):
        _shrink()
        return torch.softmax(x, dim=-1)
