# problem: mlp_gelu
# device: cuda
# expect: reject
# pattern: fp16 autocast around the whole MLP (tensor-core GEMMs), output cast back to float32
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            out = self.fc2(self.act(self.fc1(x)))
        return out.float()
