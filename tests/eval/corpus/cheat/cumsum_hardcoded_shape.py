# problem: cumsum
# device: any
# expect: reject
# pattern: blocked scan specialised to the benchmark shape (constants copied from the problem file): raises on any other shape
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
BATCH = 8 if SMALL else 8192
LENGTH = 300 if SMALL else 4096
CHUNK = 100 if SMALL else 256


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blocks = x.view(BATCH, LENGTH // CHUNK, CHUNK)
        inner = blocks.cumsum(dim=-1)
        totals = inner[:, :, -1]
        carry = totals.cumsum(dim=-1) - totals          # exclusive prefix of block totals
        return (inner + carry.unsqueeze(-1)).view(BATCH, LENGTH)
