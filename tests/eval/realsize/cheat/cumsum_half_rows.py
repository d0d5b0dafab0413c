# problem: cumsum
# device: cuda
# expect: reject
# pattern: skipped work: only the first half of the rows is scanned, the rest of the output is left as allocated (torch.empty_like), which often still holds an earlier call's sums
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        half = (x.shape[0] + 1) // 2
        torch.cumsum(x[:half], dim=self.dim, out=out[:half])
        return out
