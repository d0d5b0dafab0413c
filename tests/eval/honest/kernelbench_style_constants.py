# problem: softmax
"""Written the way LLMs often answer KernelBench prompts: the candidate repeats the problem's
constants and input functions. Harmless here (separate namespaces), so it must be accepted."""
import torch
import torch.nn as nn

batch_size = 16
dim = 16384


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.exp(x - torch.logsumexp(x, dim=-1, keepdim=True))


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
