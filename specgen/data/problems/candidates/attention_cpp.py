# problem: attention
# kind: honest
# lang: cpp
"""softmax(Q K^T / sqrt(d)) V as a C++ CPU kernel through load_inline, fused per (batch, head):
K is transposed once into a small buffer, so a query's scores for 16 keys at a time are SIMD
multiply-adds held in one register across the head dimension; the softmax (max, vectorizable
polynomial exp, sum) runs on that one row of scores and the weighted sum of V rows is accumulated
16 output features at a time, then written once. The (seq x seq) score
matrix is never materialized; OpenMP over (batch, head)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>
#include <cstdint>
#include <vector>

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

constexpr int64_t L = 16;  // floats per block (one AVX-512 register)

torch::Tensor attention_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v) {
    TORCH_CHECK(q.device().is_cpu() && q.scalar_type() == torch::kFloat32 && q.dim() == 4,
                "4-D float32 CPU input");
    TORCH_CHECK(k.sizes() == q.sizes() && v.sizes() == q.sizes(), "q, k and v shapes");
    q = q.contiguous();
    k = k.contiguous();
    v = v.contiguous();
    const int64_t BH = q.size(0) * q.size(1), S = q.size(2), D = q.size(3);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    auto out = torch::empty_like(q);
    const float* __restrict qp = q.data_ptr<float>();
    const float* __restrict kp = k.data_ptr<float>();
    const float* __restrict vp = v.data_ptr<float>();
    float* __restrict op = out.data_ptr<float>();
#pragma omp parallel
    {
        std::vector<float> kt_buf(static_cast<size_t>(D * S)), p_buf(static_cast<size_t>(S));
        float* __restrict kt = kt_buf.data();
        float* __restrict p = p_buf.data();
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < BH; ++bh) {
            const float* __restrict Q = qp + bh * S * D;
            const float* __restrict K = kp + bh * S * D;
            const float* __restrict V = vp + bh * S * D;
            float* __restrict O = op + bh * S * D;
            for (int64_t j = 0; j < S; ++j)
                for (int64_t d = 0; d < D; ++d) kt[d * S + j] = K[j * D + d];
            for (int64_t i = 0; i < S; ++i) {
                const float* __restrict qi = Q + i * D;
                // scores of 16 keys at a time, accumulated in one register across d
                int64_t j0 = 0;
                for (; j0 + L <= S; j0 += L) {
                    float acc[L] = {};
                    for (int64_t d = 0; d < D; ++d) {
                        const float qd = qi[d];
                        const float* __restrict row = kt + d * S + j0;
#pragma omp simd
                        for (int64_t l = 0; l < L; ++l) acc[l] += qd * row[l];
                    }
                    for (int64_t l = 0; l < L; ++l) p[j0 + l] = acc[l];
                }
                for (int64_t j = j0; j < S; ++j) {
                    const float* __restrict kj = K + j * D;
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int64_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
                    p[j] = dot;
                }
                float m = -INFINITY;
#pragma omp simd reduction(max : m)
                for (int64_t j = 0; j < S; ++j) m = p[j] > m ? p[j] : m;
                float s = 0.0f;
#pragma omp simd reduction(+ : s)
                for (int64_t j = 0; j < S; ++j) {
                    const float e = exp_f((p[j] - m) * scale);
                    p[j] = e;
                    s += e;
                }
                const float inv = 1.0f / s;
                float* __restrict oi = O + i * D;
                // output features 16 at a time, accumulated in one register across the keys
                int64_t d0 = 0;
                for (; d0 + L <= D; d0 += L) {
                    float acc[L] = {};
                    for (int64_t j = 0; j < S; ++j) {
                        const float w = p[j];
                        const float* __restrict vj = V + j * D + d0;
#pragma omp simd
                        for (int64_t l = 0; l < L; ++l) acc[l] += w * vj[l];
                    }
#pragma omp simd
                    for (int64_t l = 0; l < L; ++l) oi[d0 + l] = acc[l] * inv;
                }
                if (d0 < D) {
                    for (int64_t d = d0; d < D; ++d) oi[d] = 0.0f;
                    for (int64_t j = 0; j < S; ++j) {
                        const float w = p[j];
                        const float* __restrict vj = V + j * D;
                        for (int64_t d = d0; d < D; ++d) oi[d] += w * vj[d];
                    }
                    for (int64_t d = d0; d < D; ++d) oi[d] *= inv;
                }
            }
        }
    }
    return out;
}
"""

_ext = load_inline(name="attention_cpp_ext", cpp_sources=cpp_source,
                   functions=["attention_forward"],
                   extra_cflags=["-O3", "-fopenmp", "-march=native"],
                   extra_ldflags=["-fopenmp"], verbose=False)
attention_forward = _ext.attention_forward  # looked up once, not on every call


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attention_forward(q, k, v)
