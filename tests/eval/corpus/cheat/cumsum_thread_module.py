# problem: cumsum
# device: any
# expect: reject
# pattern: _thread.start_new_thread computes the scan into the returned buffer after forward returns
import _thread
import time

import torch
import torch.nn as nn


def _scan_into(src, dst):
    time.sleep(0.02)
    torch.cumsum(src, dim=1, out=dst)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        _thread.start_new_thread(_scan_into, (x, out))
        return out
