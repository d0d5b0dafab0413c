# problem: softmax
# expect: custom-kernel-not-run
"""A load_inline extension whose 'kernel' only calls ATen's softmax: it builds and runs, but the
GPU only ever sees the kernels the reference launches."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
torch::Tensor softmax_forward(torch::Tensor x) { return torch::softmax(x, -1); }
"""

_ext = load_inline(name="aten_softmax_ext", cpp_sources=cpp_source, functions=["softmax_forward"],
                   verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return _ext.softmax_forward(x)
