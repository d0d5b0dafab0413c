# problem: matmul_bias_relu
# kind: honest
# lang: cpp
"""Linear + ReLU as a C++ CPU kernel through load_inline: four rows of x per pass over the weight
(each weight row read once per four outputs), SIMD dot products along the contiguous K axis, bias
and ReLU applied as each output is written (no separate epilogue pass); OpenMP over row blocks."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cstdint>

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

torch::Tensor linear_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() == 2,
                "2-D float32 CPU input");
    TORCH_CHECK(weight.dim() == 2 && weight.size(1) == x.size(1) &&
                bias.numel() == weight.size(0), "parameter shapes");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
    auto y = torch::empty({M, N}, x.options());
    linear_act(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
               y.data_ptr<float>(), M, N, K, [](float v) { return v < 0.0f ? 0.0f : v; });
    return y;
}
"""

_ext = load_inline(name="matmul_bias_relu_cpp_ext", cpp_sources=cpp_source,
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
