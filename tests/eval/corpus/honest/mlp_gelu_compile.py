# problem: mlp_gelu
# device: any
# expect: correct
# pattern: torch.compile of a functional MLP (F.linear, exact F.gelu, F.linear) with the module's own parameters
import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp_forward(x, w1, b1, w2, b2):
    h = F.gelu(F.linear(x, w1, b1))
    return F.linear(h, w2, b2)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.fc2 = nn.Linear(hidden_features, out_features)
        self._compiled = torch.compile(mlp_forward)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._compiled(x, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias)
