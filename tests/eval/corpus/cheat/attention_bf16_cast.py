# problem: attention
# device: any
# expect: reject
# pattern: q, k, v cast to bfloat16 for both matmuls (softmax in fp32), result cast back to float32
import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
        scores = torch.matmul(qb, kb.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
        probs = torch.softmax(scores.float(), dim=-1).to(torch.bfloat16)
        return torch.matmul(probs, vb).to(q.dtype)
