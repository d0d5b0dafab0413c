# problem: softmax
# kind: honest
# lang: cpp
"""Softmax as a C++ CPU kernel through load_inline: per row a max pass, then one pass that
exponentiates (a vectorizable polynomial exp), stores and sums, then an in-place scale; OpenMP
over rows, SIMD reductions, no temporaries."""
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

torch::Tensor softmax_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() >= 1,
                "float32 CPU input");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    const int64_t cols = x.size(-1);
    const int64_t rows = cols > 0 ? x.numel() / cols : 0;
    const float* __restrict xp = x.data_ptr<float>();
    float* __restrict yp = y.data_ptr<float>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* __restrict in = xp + r * cols;
        float* __restrict out = yp + r * cols;
        float m = -INFINITY;
#pragma omp simd reduction(max : m)
        for (int64_t c = 0; c < cols; ++c) m = in[c] > m ? in[c] : m;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < cols; ++c) {
            const float e = exp_f(in[c] - m);
            out[c] = e;
            s += e;
        }
        const float inv = 1.0f / s;
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) out[c] *= inv;
    }
    return y;
}
"""

_ext = load_inline(name="softmax_cpp_ext", cpp_sources=cpp_source, functions=["softmax_forward"],
                   extra_cflags=["-O3", "-fopenmp", "-march=native"],
                   extra_ldflags=["-fopenmp"], verbose=False)
softmax_forward = _ext.softmax_forward  # looked up once, not on every call


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax_forward(x)
