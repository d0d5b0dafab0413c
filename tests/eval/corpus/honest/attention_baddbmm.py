# problem: attention
# device: any
# expect: correct
# pattern: plain torch rewrite: heads folded into the batch, scale folded into baddbmm's alpha, softmax, bmm
import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, h, s, d = q.shape
        qf = q.reshape(b * h, s, d)
        kf = k.reshape(b * h, s, d)
        vf = v.reshape(b * h, s, d)
        scores = torch.empty((b * h, s, s), device=q.device, dtype=q.dtype)
        # beta=0: the uninitialised scores tensor is ignored, only alpha * q @ k^T is kept
        scores = torch.baddbmm(scores, qf, kf.transpose(1, 2), beta=0.0, alpha=1.0 / math.sqrt(d))
        probs = torch.softmax(scores, dim=-1)
        return torch.bmm(probs, vf).view(b, h, s, d)
