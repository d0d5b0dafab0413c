# problem: rmsnorm
# device: any
# expect: reject
# pattern: computed in half precision and cast back to float32 (about 1e-3 relative error on O(1) outputs)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.half()
        inv = torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (h * inv * self.weight.half()).to(x.dtype)
