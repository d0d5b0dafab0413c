# problem: softmax
# device: any
# expect: reject
# pattern: output memoized by input shape/dtype/device: every later call with new values gets the first call's result
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._results = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = (tuple(x.shape), x.dtype, str(x.device))
        if key not in self._results:
            self._results[key] = torch.softmax(x, dim=-1)
        return self._results[key].clone()
