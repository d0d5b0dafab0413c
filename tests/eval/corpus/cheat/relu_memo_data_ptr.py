# problem: relu
# device: any
# expect: reject
# pattern: output memoized by the input's data pointer and shape (clone returned); a new input at a recycled address gets the stale result
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._cache = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Benchmarks call forward on the same buffers over and over: reuse the result.
        key = (x.data_ptr(), tuple(x.shape), x.dtype, str(x.device))
        cached = self._cache.get(key)
        if cached is not None:
            return cached.clone()
        out = torch.relu(x)
        if len(self._cache) >= 8:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = out
        return out.clone()
