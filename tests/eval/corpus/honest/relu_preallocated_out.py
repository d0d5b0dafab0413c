# problem: relu
# device: any
# expect: correct
# pattern: output buffer allocated once and reused across calls; every call writes the result fresh (out=)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._out = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self._out
        if out is None or out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
            # Allocate once per shape; later calls overwrite the same storage.
            out = torch.empty_like(x, memory_format=torch.contiguous_format)
            self._out = out
        torch.clamp_min(x, 0.0, out=out)
        return out
