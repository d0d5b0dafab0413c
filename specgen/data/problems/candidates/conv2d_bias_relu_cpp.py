# problem: conv2d_bias_relu
# kind: honest
# lang: cpp
"""3x3 "same" convolution + bias + ReLU as a C++ CPU kernel through load_inline: a direct
convolution on a zero-padded copy of the input in which each output plane is computed at the
padded width, so every filter tap is one long SIMD multiply-add over the whole plane (no bounds
checks, no im2col matrix); bias first, ReLU fused into the copy-out; OpenMP over (image, output
channel)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cstdint>
#include <vector>

torch::Tensor conv2d_bias_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() == 4,
                "4-D float32 CPU input");
    TORCH_CHECK(weight.dim() == 4 && weight.size(1) == x.size(1) && bias.numel() == weight.size(0)
                && weight.size(2) % 2 == 1 && weight.size(3) % 2 == 1, "parameter shapes");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    const int64_t OC = weight.size(0), KH = weight.size(2), KW = weight.size(3);
    const int64_t ph = KH / 2, pw = KW / 2, Hp = H + 2 * ph, Wp = W + 2 * pw;
    // Output rows computed at the padded width Wp: tap (kh, kw) reads the padded plane shifted by
    // kh * Wp + kw, one contiguous run; the last 2 * pw columns of each row are discarded.
    const int64_t span = (H - 1) * Wp + W;
    auto y = torch::empty({B, OC, H, W}, x.options());
    std::vector<float> padded(static_cast<size_t>(B * C * Hp * Wp), 0.0f);
    const float* __restrict xp = x.data_ptr<float>();
    for (int64_t plane = 0; plane < B * C; ++plane)
        for (int64_t h = 0; h < H; ++h) {
            const float* __restrict src = xp + (plane * H + h) * W;
            float* __restrict dst = padded.data() + (plane * Hp + h + ph) * Wp + pw;
            for (int64_t w = 0; w < W; ++w) dst[w] = src[w];
        }
    const float* __restrict pp = padded.data();
    const float* __restrict wp = weight.data_ptr<float>();
    const float* __restrict bp = bias.data_ptr<float>();
    float* __restrict yp = y.data_ptr<float>();
#pragma omp parallel
    {
        std::vector<float> acc(static_cast<size_t>(H * Wp));
        float* __restrict a = acc.data();
#pragma omp for collapse(2) schedule(static)
        for (int64_t b = 0; b < B; ++b)
            for (int64_t oc = 0; oc < OC; ++oc) {
                const float bv = bp[oc];
#pragma omp simd
                for (int64_t q = 0; q < span; ++q) a[q] = bv;
                for (int64_t c = 0; c < C; ++c) {
                    const float* __restrict in = pp + (b * C + c) * Hp * Wp;
                    const float* __restrict taps = wp + (oc * C + c) * KH * KW;
                    for (int64_t kh = 0; kh < KH; ++kh)
                        for (int64_t kw = 0; kw < KW; ++kw) {
                            const float t = taps[kh * KW + kw];
                            const float* __restrict src = in + kh * Wp + kw;
#pragma omp simd
                            for (int64_t q = 0; q < span; ++q) a[q] += t * src[q];
                        }
                }
                float* __restrict out = yp + (b * OC + oc) * H * W;
                for (int64_t h = 0; h < H; ++h) {
#pragma omp simd
                    for (int64_t w = 0; w < W; ++w) {
                        const float v = a[h * Wp + w];
                        out[h * W + w] = v < 0.0f ? 0.0f : v;
                    }
                }
            }
    }
    return y;
}
"""

_ext = load_inline(name="conv2d_bias_relu_cpp_ext", cpp_sources=cpp_source,
                   functions=["conv2d_bias_relu_forward"],
                   extra_cflags=["-O3", "-fopenmp", "-march=native"],
                   extra_ldflags=["-fopenmp"], verbose=False)
conv2d_bias_relu_forward = _ext.conv2d_bias_relu_forward  # looked up once, not on every call


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv2d_bias_relu_forward(x, self.conv.weight, self.conv.bias)
