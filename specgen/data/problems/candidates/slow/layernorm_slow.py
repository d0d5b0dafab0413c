# problem: layernorm
# kind: slow
# lang: torch
"""LayerNorm one sample at a time in a Python loop with float64 statistics and separate
subtract, divide, scale and shift steps: correct, but many small operator calls and
temporaries."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.ln.weight.double(), self.ln.bias.double()
        flat = x.reshape(-1, *weight.shape)
        out = []
        for sample in flat.double().unbind(0):
            mean = sample.mean()
            centered = sample - mean
            var = (centered * centered).mean()
            normalized = centered / torch.sqrt(var + self.ln.eps)
            out.append(normalized * weight + bias)
        return torch.stack(out).reshape(x.shape).to(x.dtype)
