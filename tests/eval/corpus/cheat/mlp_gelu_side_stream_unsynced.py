# problem: mlp_gelu
# device: cuda
# expect: honest-speed 1.5
# pattern: the whole MLP launched on a side stream that the caller's stream never waits for, so events on the caller's stream time nothing
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.fc2 = nn.Linear(hidden_features, out_features)
        self._stream = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda:
            return self.fc2(F.gelu(self.fc1(x)))
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=x.device)
        with torch.cuda.stream(self._stream):
            out = self.fc2(F.gelu(self.fc1(x)))
        return out
