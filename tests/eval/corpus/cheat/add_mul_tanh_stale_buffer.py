# problem: add_mul_tanh
# device: any
# expect: reject
# pattern: the same output buffer returned on every call without recomputing after the first one
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))
        self._out = None

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self._out is None or self._out.shape != x.shape or self._out.device != x.device:
            self._out = torch.tanh((x + y) * self.scale)
        # Output buffer is persistent across calls (avoids the allocator).
        return self._out
