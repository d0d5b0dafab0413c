# problem: attention
# kind: slow
# lang: torch
"""Attention one query at a time in Python loops over (batch, head, query): a matrix-vector
product for the query's scores, their softmax, a matrix-vector product with V: correct, but
several tiny operator calls per query instead of batched matrix products."""
import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        batch, heads = q.shape[0], q.shape[1]
        scale = 1.0 / math.sqrt(q.size(-1))
        out = torch.empty_like(q)
        for b in range(batch):
            for h in range(heads):
                keys, values = k[b, h], v[b, h]
                for i in range(q.shape[2]):
                    weights = torch.softmax(torch.mv(keys, q[b, h, i]) * scale, dim=-1)
                    out[b, h, i] = torch.mv(values.t(), weights)
        return out
