# problem: mlp_gelu
# kind: honest
# lang: torch
"""The GELU MLP in plain PyTorch: each layer one addmm with its bias folded in, the GELU between
them."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.fc2 = nn.Linear(hidden_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.gelu(torch.addmm(self.fc1.bias, x, self.fc1.weight.t()))
        return torch.addmm(self.fc2.bias, hidden, self.fc2.weight.t())
