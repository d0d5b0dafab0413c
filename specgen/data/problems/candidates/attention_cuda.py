# problem: attention
# kind: honest
# lang: cuda
"""Attention as one CUDA kernel through load_inline, flash-attention style with one query per
thread: a block of 128 queries of one (batch, head) keeps each query and its output accumulator
in registers, stages 16 keys and values at a time in shared memory (every thread reads the same
key: broadcasts), computes the 16 scores, rescales the accumulator once per tile (online softmax,
fp32 throughout) and adds the weighted values; the score matrix never reaches global memory."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <cfloat>

constexpr int QUERIES = 128, KT = 16;

template <int MAXD>  // head_dim rounded up; lanes past D hold zeros
__global__ void __launch_bounds__(QUERIES)
attention_kernel(const float* __restrict__ q, const float* __restrict__ k,
                 const float* __restrict__ v, float* __restrict__ o, int S, int D, float scale) {
    __shared__ float ks[KT][MAXD];
    __shared__ float vs[KT][MAXD];
    const int64_t base = (int64_t)blockIdx.y * S * D;
    const int i = blockIdx.x * QUERIES + threadIdx.x;
    const bool active = i < S;
    float qr[MAXD], acc[MAXD];
#pragma unroll
    for (int d = 0; d < MAXD; ++d) {
        qr[d] = (active && d < D) ? q[base + (int64_t)i * D + d] * scale : 0.0f;
        acc[d] = 0.0f;
    }
    float m = -FLT_MAX, l = 0.0f;
    for (int j0 = 0; j0 < S; j0 += KT) {
        const int count = min(KT, S - j0);
        for (int e = threadIdx.x; e < KT * MAXD; e += QUERIES) {
            const int j = e / MAXD, d = e % MAXD;
            const bool ok = j < count && d < D;
            ks[j][d] = ok ? k[base + (int64_t)(j0 + j) * D + d] : 0.0f;
            vs[j][d] = ok ? v[base + (int64_t)(j0 + j) * D + d] : 0.0f;
        }
        __syncthreads();
        float s[KT];
        float tile_max = -FLT_MAX;
#pragma unroll
        for (int j = 0; j < KT; ++j) {
            float dot = 0.0f;
#pragma unroll
            for (int d = 0; d < MAXD; ++d) dot = fmaf(qr[d], ks[j][d], dot);
            s[j] = j < count ? dot : -FLT_MAX;
            tile_max = fmaxf(tile_max, s[j]);
        }
        const float m_new = fmaxf(m, tile_max);
        const float correction = expf(m - m_new);
        l *= correction;
#pragma unroll
        for (int d = 0; d < MAXD; ++d) acc[d] *= correction;
#pragma unroll
        for (int j = 0; j < KT; ++j) {
            const float p = j < count ? expf(s[j] - m_new) : 0.0f;
            l += p;
#pragma unroll
            for (int d = 0; d < MAXD; ++d) acc[d] = fmaf(p, vs[j][d], acc[d]);
        }
        m = m_new;
        __syncthreads();
    }
    if (!active) return;
    const float inv = 1.0f / l;
#pragma unroll
    for (int d = 0; d < MAXD; ++d)
        if (d < D) o[base + (int64_t)i * D + d] = acc[d] * inv;
}

torch::Tensor attention_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v) {
    TORCH_CHECK(q.is_cuda() && q.dim() == 4 && q.scalar_type() == torch::kFloat32,
                "4-D float32 CUDA input");
    TORCH_CHECK(k.sizes() == q.sizes() && v.sizes() == q.sizes(), "q, k and v shapes");
    q = q.contiguous();
    k = k.contiguous();
    v = v.contiguous();
    const int BH = (int)(q.size(0) * q.size(1)), S = (int)q.size(2), D = (int)q.size(3);
    TORCH_CHECK(D <= 128, "head_dim up to 128");
    auto out = torch::empty_like(q);
    if (BH == 0 || S == 0 || D == 0) return out;
    const float scale = 1.0f / sqrtf((float)D);
    const dim3 grid((S + QUERIES - 1) / QUERIES, BH);
    auto stream = c10::cuda::getCurrentCUDAStream();
    const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
    float* op = out.data_ptr<float>();
    if (D <= 32) attention_kernel<32><<<grid, QUERIES, 0, stream>>>(qp, kp, vp, op, S, D, scale);
    else if (D <= 64) attention_kernel<64><<<grid, QUERIES, 0, stream>>>(qp, kp, vp, op, S, D, scale);
    else attention_kernel<128><<<grid, QUERIES, 0, stream>>>(qp, kp, vp, op, S, D, scale);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(name="attention_cuda_ext",
                   cpp_sources="torch::Tensor attention_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v);",
                   cuda_sources=cuda_source, functions=["attention_forward"],
                   extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _ext.attention_forward(q, k, v)
