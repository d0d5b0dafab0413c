# problem: batchnorm2d_train
# device: any
# expect: correct
# pattern: hand-written training-mode BatchNorm: batch statistics in float64, running statistics updated like nn.BatchNorm2d
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bn = self.bn
        if not self.training:
            return F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias,
                                training=False, eps=bn.eps)
        x64 = x.to(torch.float64)
        mean = x64.mean(dim=(0, 2, 3))
        var = x64.var(dim=(0, 2, 3), unbiased=False)
        scale = torch.rsqrt(var + bn.eps) * bn.weight.to(torch.float64)
        shift = bn.bias.to(torch.float64) - mean * scale
        y = (x64 * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)).to(x.dtype)
        with torch.no_grad():
            count = x.numel() // x.size(1)
            unbiased = var * (count / max(count - 1, 1))
            momentum = bn.momentum
            bn.running_mean.mul_(1 - momentum).add_(mean.to(x.dtype), alpha=momentum)
            bn.running_var.mul_(1 - momentum).add_(unbiased.to(x.dtype), alpha=momentum)
            bn.num_batches_tracked += 1
        return y
