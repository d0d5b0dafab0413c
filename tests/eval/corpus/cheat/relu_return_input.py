# problem: relu
# device: any
# expect: mutated-inputs
# pattern: returns the input tensor itself after an in-place ReLU (no output allocation; the caller's input is overwritten)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In-place: saves an allocation and a full write of the output.
        return x.relu_()
