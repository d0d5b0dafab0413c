# problem: relu
# device: any
# expect: reject
# pattern: threading.Thread fills the output after forward has returned an unfilled buffer
import threading
import time

import torch
import torch.nn as nn


def _fill(src, dst):
    time.sleep(0.02)   # let the caller's timed region close first
    torch.relu(src, out=dst)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        # Overlap the computation with whatever the caller does next.
        threading.Thread(target=_fill, args=(x, out), daemon=True).start()
        return out
