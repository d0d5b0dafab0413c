# problem: layernorm
# kind: honest
# lang: cpp
"""LayerNorm as a C++ CPU kernel through load_inline: per sample a two-pass mean and variance
(SIMD reductions, no cancellation from E[x^2] - E[x]^2), then one pass that normalizes and applies
the affine parameters; OpenMP over samples."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>
#include <cstdint>

torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias,
                                double eps) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32, "float32 CPU input");
    TORCH_CHECK(weight.numel() == bias.numel() && weight.numel() > 0, "parameters");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    auto y = torch::empty_like(x);
    const int64_t n = weight.numel();
    const int64_t rows = x.numel() / n;
    const float* __restrict xp = x.data_ptr<float>();
    const float* __restrict wp = weight.data_ptr<float>();
    const float* __restrict bp = bias.data_ptr<float>();
    float* __restrict yp = y.data_ptr<float>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* __restrict in = xp + r * n;
        float* __restrict out = yp + r * n;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < n; ++i) s += in[i];
        const float mean = s / static_cast<float>(n);
        float q = 0.0f;
#pragma omp simd reduction(+ : q)
        for (int64_t i = 0; i < n; ++i) {
            const float d = in[i] - mean;
            q += d * d;
        }
        const float rstd = 1.0f / std::sqrt(q / static_cast<float>(n) + static_cast<float>(eps));
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) out[i] = (in[i] - mean) * rstd * wp[i] + bp[i];
    }
    return y;
}
"""

_ext = load_inline(name="layernorm_cpp_ext", cpp_sources=cpp_source,
                   functions=["layernorm_forward"],
                   extra_cflags=["-O3", "-fopenmp", "-march=native"],
                   extra_ldflags=["-fopenmp"], verbose=False)
layernorm_forward = _ext.layernorm_forward  # looked up once, not on every call


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layernorm_forward(x, self.ln.weight, self.ln.bias, self.ln.eps)
