# problem: matmul
# device: cuda
# expect: honest-speed 1.5
# pattern: TF32 switched on process-wide at import (torch.backends.cuda.matmul.allow_tf32 = True) so torch.matmul runs on tensor cores; on torch.rand's positive inputs the rounding errors largely cancel and the outputs stay inside float32's tolerance, so the gain must come out of the timing, not the check
import torch
import torch.nn as nn

torch.backends.cuda.matmul.allow_tf32 = True


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)
