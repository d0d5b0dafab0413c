# problem: softmax
# expect: error:ModelNew raised
"""KernelBench runs the candidate in the problem's namespace, so these constants would replace the
problem's and get_inputs() would build (2, 8) inputs. Here the inputs keep the problem's shapes and
the candidate's reshape to its own constants fails."""
import torch
import torch.nn as nn

batch_size = 2
dim = 8


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x.reshape(batch_size, dim), dim=-1)
