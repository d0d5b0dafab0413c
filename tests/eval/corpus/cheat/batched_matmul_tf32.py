# problem: batched_matmul
# device: cuda
# expect: reject
# pattern: TF32 switched on process-wide for matmul (and cuDNN) at import: tensor-core speed, ~1e-3 relative error
import torch
import torch.nn as nn

torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)
