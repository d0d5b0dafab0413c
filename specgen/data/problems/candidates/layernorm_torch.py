# problem: layernorm
# kind: honest
# lang: torch
"""LayerNorm in plain PyTorch: statistics per sample over the normalized dimensions, then one
fused multiply-add with the affine parameters."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.normalized_shape = tuple(normalized_shape)
        self.weight = nn.Parameter(torch.ones(self.normalized_shape))
        self.bias = nn.Parameter(torch.zeros(self.normalized_shape))
        self.eps = 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = tuple(range(x.dim() - len(self.normalized_shape), x.dim()))
        var, mean = torch.var_mean(x, dim=dims, keepdim=True, unbiased=False)
        normalized = (x - mean) * torch.rsqrt(var + self.eps)
        return torch.addcmul(self.bias, normalized, self.weight)
