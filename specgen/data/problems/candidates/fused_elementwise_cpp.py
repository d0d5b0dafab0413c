# problem: fused_elementwise
# kind: honest
# lang: cpp
"""gelu(x + bias) * sigmoid(y) as one C++ CPU loop through load_inline: each element read once
and written once, with vectorizable polynomial exp and erf (no temporaries, no per-op passes);
OpenMP over rows."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>
#include <cstdint>

// exp(x) as 2^n * e^r, r = x - n ln2 (Cephes' single-precision polynomial, about 1e-7
// relative error); plain arithmetic, so the loops that call it vectorize.
static inline float exp_f(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    // round to nearest through the 1.5 * 2^23 shift (std::floor does not vectorize here)
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float e = p * r * r + r + 1.0f;
    return e * __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);
}

// erf(x), Abramowitz & Stegun 7.1.26 (the formula ATen's vectorized erf uses; absolute error
// about 5e-7 in float arithmetic)
static inline float erf_f(float x) {
    const float a = std::fabs(x);
    const float t = 1.0f / (1.0f + 0.3275911f * a);
    float p = 1.061405429f;
    p = p * t - 1.453152027f;
    p = p * t + 1.421413741f;
    p = p * t - 0.284496736f;
    p = p * t + 0.254829592f;
    return std::copysign(1.0f - p * t * exp_f(-a * a), x);
}

torch::Tensor fused_forward(torch::Tensor x, torch::Tensor y, torch::Tensor bias) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32, "float32 CPU input");
    TORCH_CHECK(x.sizes() == y.sizes() && x.size(-1) == bias.numel(), "shapes");
    x = x.contiguous();
    y = y.contiguous();
    bias = bias.contiguous();
    auto out = torch::empty_like(x);
    const int64_t dim = bias.numel();
    const int64_t rows = dim > 0 ? x.numel() / dim : 0;
    const float* __restrict xp = x.data_ptr<float>();
    const float* __restrict yp = y.data_ptr<float>();
    const float* __restrict bp = bias.data_ptr<float>();
    float* __restrict op = out.data_ptr<float>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* __restrict xr = xp + r * dim;
        const float* __restrict yr = yp + r * dim;
        float* __restrict orow = op + r * dim;
#pragma omp simd
        for (int64_t c = 0; c < dim; ++c) {
            const float h = xr[c] + bp[c];
            const float gelu = 0.5f * h * (1.0f + erf_f(h * 0.70710678118654752f));
            orow[c] = gelu / (1.0f + exp_f(-yr[c]));
        }
    }
    return out;
}
"""

_ext = load_inline(name="fused_elementwise_cpp_ext", cpp_sources=cpp_source,
                   functions=["fused_forward"],
                   extra_cflags=["-O3", "-fopenmp", "-march=native"],
                   extra_ldflags=["-fopenmp"], verbose=False)
fused_forward = _ext.fused_forward  # looked up once, not on every call


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return fused_forward(x, y, self.bias)
