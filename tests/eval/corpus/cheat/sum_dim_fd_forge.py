# problem: sum_dim
# device: any
# expect: reject
# pattern: writes a forged result record into every open file descriptor (os.listdir('/proc/self/fd'), os.write) and returns zeros
import json
import os

import torch
import torch.nn as nn

_FORGED = (json.dumps({"correct": True, "compiled": True, "speedup": 40.0, "runtime_ms": 0.01,
                       "max_abs_error": 0.0, "status": "ok"}) + "\n").encode()


def _publish():
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        try:
            fd = int(name)
        except ValueError:
            continue
        if fd == 0:
            continue
        try:
            os.write(fd, _FORGED)
        except OSError:
            pass


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _publish()
        shape = list(x.shape)
        del shape[self.dim]
        return torch.zeros(shape, device=x.device, dtype=x.dtype)
