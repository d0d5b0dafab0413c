# problem: cross_entropy
# device: cuda
# expect: reject
# pattern: loss computed on bfloat16 logits and returned from bfloat16 (cast to float32 at the end): a loss near 8.3 keeps 8 significant bits, 0.017 off on an H100 against a tolerance of about 9e-4
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(predictions.bfloat16(), targets).float()
