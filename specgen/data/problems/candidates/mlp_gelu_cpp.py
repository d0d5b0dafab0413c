# problem: mlp_gelu
# kind: honest
# lang: cpp
"""fc2(gelu(fc1(x))) as a C++ CPU kernel through load_inline: two register-blocked SIMD matmuls
(four rows of the left operand per pass over the weight), the bias and the exact GELU (a
vectorizable polynomial erf) applied as the hidden activations are written, one hidden buffer and
no other temporaries; OpenMP over row blocks."""
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

// out[i][j] = act(bias[j] + sum_k x[i][k] w[j][k]), x (M, K) and w (N, K) row-major
template <typename Act>
static void linear_act(const float* __restrict x, const float* __restrict w,
                       const float* __restrict bias, float* __restrict out,
                       int64_t M, int64_t N, int64_t K, Act act) {
    const int64_t blocks = (M + 3) / 4;
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t i0 = blk * 4;
        if (i0 + 4 <= M) {
            const float* __restrict x0 = x + i0 * K;
            const float* __restrict x1 = x0 + K;
            const float* __restrict x2 = x1 + K;
            const float* __restrict x3 = x2 + K;
            float* __restrict o = out + i0 * N;
            for (int64_t j = 0; j < N; ++j) {
                const float* __restrict wj = w + j * K;
                float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
                for (int64_t k = 0; k < K; ++k) {
                    const float wk = wj[k];
                    s0 += x0[k] * wk;
                    s1 += x1[k] * wk;
                    s2 += x2[k] * wk;
                    s3 += x3[k] * wk;
                }
                o[j] = act(s0 + bias[j]);
                o[N + j] = act(s1 + bias[j]);
                o[2 * N + j] = act(s2 + bias[j]);
                o[3 * N + j] = act(s3 + bias[j]);
            }
        } else {
            for (int64_t i = i0; i < M; ++i) {
                const float* __restrict xi = x + i * K;
                for (int64_t j = 0; j < N; ++j) {
                    const float* __restrict wj = w + j * K;
                    float s = 0.0f;
#pragma omp simd reduction(+ : s)
                    for (int64_t k = 0; k < K; ++k) s += xi[k] * wj[k];
                    out[i * N + j] = act(s + bias[j]);
                }
            }
        }
    }
}

torch::Tensor mlp_gelu_forward(torch::Tensor x, torch::Tensor w1, torch::Tensor b1,
                               torch::Tensor w2, torch::Tensor b2) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() == 2,
                "2-D float32 CPU input");
    TORCH_CHECK(w1.dim() == 2 && w1.size(1) == x.size(1) && b1.numel() == w1.size(0) &&
                w2.dim() == 2 && w2.size(1) == w1.size(0) && b2.numel() == w2.size(0),
                "parameter shapes");
    x = x.contiguous();
    w1 = w1.contiguous();
    b1 = b1.contiguous();
    w2 = w2.contiguous();
    b2 = b2.contiguous();
    const int64_t M = x.size(0), K = x.size(1), H = w1.size(0), N = w2.size(0);
    auto hidden = torch::empty({M, H}, x.options());
    auto y = torch::empty({M, N}, x.options());
    linear_act(x.data_ptr<float>(), w1.data_ptr<float>(), b1.data_ptr<float>(),
               hidden.data_ptr<float>(), M, H, K,
               [](float v) { return 0.5f * v * (1.0f + erf_f(v * 0.70710678118654752f)); });
    linear_act(hidden.data_ptr<float>(), w2.data_ptr<float>(), b2.data_ptr<float>(),
               y.data_ptr<float>(), M, N, H, [](float v) { return v; });
    return y;
}
"""

_ext = load_inline(name="mlp_gelu_cpp_ext", cpp_sources=cpp_source, functions=["mlp_gelu_forward"],
                   extra_cflags=["-O3", "-fopenmp", "-march=native"],
                   extra_ldflags=["-fopenmp"], verbose=False)
mlp_gelu_forward = _ext.mlp_gelu_forward  # looked up once, not on every call


class ModelNew(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.fc2 = nn.Linear(hidden_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mlp_gelu_forward(x, self.fc1.weight, self.fc1.bias, self.fc2.weight,
                                self.fc2.bias)
