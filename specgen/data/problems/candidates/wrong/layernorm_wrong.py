# problem: layernorm
# kind: wrong
# lang: torch
"""LayerNorm in PyTorch with the statistics taken over the last dimension only instead of all
three normalized dimensions: each row of dim2 elements is normalized on its own."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var, mean = torch.var_mean(x, dim=-1, keepdim=True, unbiased=False)
        return (x - mean) * torch.rsqrt(var + self.ln.eps) * self.ln.weight + self.ln.bias
