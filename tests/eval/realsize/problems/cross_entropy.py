"""Cross-entropy loss of logits against class indices, averaged over the batch:
out = F.cross_entropy(predictions, targets), a 0-dim float32 tensor.

KernelBench's size: predictions (32768, 4096) float32 from torch.rand (537 MB), targets int64
from torch.randint(0, 4096). The loss is about log(4096) = 8.3, so the tolerance on the one
output is about 9e-4. SPECGEN_PROBLEM_SCALE=small picks a CPU-sized instance.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 16 if SMALL else 32768
num_classes = 10 if SMALL else 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(predictions, targets)


def get_inputs():
    return [torch.rand(batch_size, num_classes),
            torch.randint(0, num_classes, (batch_size,))]


def get_init_inputs():
    return []
