"""Two-layer MLP: out = fc2(gelu(fc1(x))), fc1 and fc2 nn.Linear layers with bias, GELU the
exact (erf) form.

x is (batch_size, in_features); the output is (batch_size, out_features).
SPECGEN_PROBLEM_SCALE=small picks a CPU-sized instance; otherwise x is 16 MB and the two
weight matrices 64 MB each.
"""
import os

import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
batch_size = 8 if SMALL else 2048
in_features = 32 if SMALL else 2048
hidden_features = 64 if SMALL else 8192
out_features = 24 if SMALL else 2048


class Model(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, hidden_features, out_features]


def get_flops():
    return 2 * batch_size * (in_features * hidden_features + hidden_features * out_features)
