# problem: batchnorm2d_train
# device: any
# expect: reject
# pattern: BatchNorm folded into a per-channel scale and shift from the running statistics, as in eval mode (the batch's own statistics are never computed)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bn = self.bn
        # Fold the normalization into one fused multiply-add per element.
        scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps)
        shift = bn.bias - bn.running_mean * scale
        return torch.addcmul(shift.view(1, -1, 1, 1), x, scale.view(1, -1, 1, 1))
