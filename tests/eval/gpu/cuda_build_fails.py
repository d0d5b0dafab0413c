# problem: softmax
# expect: custom-kernel-not-run
"""A CUDA extension with a compile error, built inside try/except with a silent PyTorch fallback
(seven KernelBench-accepted candidates did this). Its kernel never runs: the launch counter sees
the fallback's kernels only."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
__global__ void softmax_rows(const float* x, float* y, int cols) { y[0] = undeclared_value; }
torch::Tensor softmax_forward(torch::Tensor x) {
    auto y = torch::empty_like(x);
    softmax_rows<<<x.size(0), 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.size(1));
    return y;
}
"""

try:
    _ext = load_inline(name="broken_softmax_ext",
                       cpp_sources="torch::Tensor softmax_forward(torch::Tensor x);",
                       cuda_sources=cuda_source, functions=["softmax_forward"], verbose=False)
except Exception:
    _ext = None


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        if _ext is None:
            return torch.softmax(x, dim=-1)
        return _ext.softmax_forward(x)
