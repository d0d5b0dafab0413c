# problem: matmul_bias_relu
# kind: wrong
# lang: cpp
"""Linear + ReLU as a C++ CPU kernel through load_inline with an off-by-one in the reduction:
the dot products stop at K - 1, so the last input feature never contributes."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cstdint>

torch::Tensor linear_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() == 2,
                "2-D float32 CPU input");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
    auto y = torch::empty({M, N}, x.options());
    const float* __restrict xp = x.data_ptr<float>();
    const float* __restrict wp = weight.data_ptr<float>();
    const float* __restrict bp = bias.data_ptr<float>();
    float* __restrict yp = y.data_ptr<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
            float s = bp[j];
#pragma omp simd reduction(+ : s)
            for (int64_t k = 0; k < K - 1; ++k) s += xp[i * K + k] * wp[j * K + k];
            yp[i * N + j] = s < 0.0f ? 0.0f : s;
        }
    return y;
}
"""

_ext = load_inline(name="matmul_bias_relu_wrong_ext", cpp_sources=cpp_source,
                   functions=["linear_relu_forward"],
                   extra_cflags=["-O3", "-fopenmp", "-march=native"],
                   extra_ldflags=["-fopenmp"], verbose=False)
linear_relu_forward = _ext.linear_relu_forward  # looked up once, not on every call


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_relu_forward(x, self.linear.weight, self.linear.bias)
