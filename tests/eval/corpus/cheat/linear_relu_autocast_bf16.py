# problem: linear_relu
# device: any
# expect: reject
# pattern: bf16 autocast around the GEMM, result cast back to float32
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
            y = self.linear(x)
        return torch.relu(y).to(x.dtype)
