# problem: mlp_gelu
# kind: slow
# lang: torch
"""The GELU MLP one input row at a time in a Python loop (matrix-vector products, GELU per
row): correct, but no matrix-matrix product and several small operator calls per row."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.fc2 = nn.Linear(hidden_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = []
        for row in x.unbind(0):
            hidden = F.gelu(torch.mv(self.fc1.weight, row) + self.fc1.bias)
            rows.append(torch.mv(self.fc2.weight, hidden) + self.fc2.bias)
        return torch.stack(rows)
