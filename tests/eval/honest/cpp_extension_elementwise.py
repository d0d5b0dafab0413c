# problem: fused_elementwise
# device: cpu
"""A C++ extension (load_inline, CPU) with a hand-written loop: built once in the worker's build
process, loaded from the cache by the runner."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor fused_gelu_sigmoid(torch::Tensor x, torch::Tensor y, torch::Tensor bias) {
    TORCH_CHECK(x.is_contiguous() && y.is_contiguous() && bias.is_contiguous(), "contiguous inputs");
    auto out = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    const float* yp = y.data_ptr<float>();
    const float* bp = bias.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const int64_t n = x.numel(), dim = bias.numel();
    for (int64_t i = 0; i < n; ++i) {
        const float h = xp[i] + bp[i % dim];
        const float gelu = 0.5f * h * (1.0f + std::erf(h * 0.70710678118654752f));
        op[i] = gelu / (1.0f + std::exp(-yp[i]));
    }
    return out;
}
"""

_ext = load_inline(name="fused_gelu_sigmoid_cpu", cpp_sources=cpp_source,
                   functions=["fused_gelu_sigmoid"], extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x, y):
        return _ext.fused_gelu_sigmoid(x.contiguous(), y.contiguous(), self.bias.detach())
