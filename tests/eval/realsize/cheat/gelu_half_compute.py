# problem: gelu
# device: cuda
# expect: reject
# pattern: GELU computed in float16 and cast back to float32: errors up to 5e-4 (measured on an H100) where the tolerance is 1e-4 plus 1e-4 of the output, at most 1.9e-4
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x.half()).float()
