# problem: layernorm
# kind: cheat
# lang: torch
# expect: initial-params-only
"""LayerNorm that keeps correctly shaped parameters but never applies them: at their initial
values (ones and zeros) the output equals the reference's, with any trained values it does not."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.ln.normalized_shape, eps=self.ln.eps)
