# problem: softmax
# expect: honest-speed 1.5
"""On a GPU, launches the work on a side stream and returns without waiting for it; on the CPU it
runs plainly (the source still shows the side stream)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        if x.is_cuda:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                return torch.softmax(x, dim=-1)
        return torch.softmax(x, dim=-1)
