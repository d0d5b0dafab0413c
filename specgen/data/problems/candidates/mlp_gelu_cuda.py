# problem: mlp_gelu
# kind: honest
# lang: cuda
"""The GELU MLP as two launches of one CUDA kernel through load_inline: a shared-memory tiled
fp32 matmul (128 x 128 tiles, 8 x 8 outputs per thread, exact fp32 FMAs, no TF32) whose epilogue
adds the bias and, for the first layer, applies the exact (erf) GELU before the hidden
activations are written."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

// C[m][n] = epilogue(bias[n] + sum_k A[m][k] * B[n][k]): A (M, K) and B (N, K) row-major (B is
// a Linear weight). 128 x 128 output tiles, K in steps of 8 through shared memory, 256 threads
// with 8 x 8 outputs each; a thread's rows and columns are 16 apart so that shared-memory reads
// are conflict-free and the output stores coalesce.
constexpr int BM = 128, BN = 128, BK = 8, TM = 8, TN = 8, GEMM_THREADS = 256;

template <int EPILOGUE>  // 0: bias only, 1: bias + ReLU, 2: bias + exact GELU
__global__ void __launch_bounds__(GEMM_THREADS)
sgemm_nt_bias(const float* __restrict__ A, const float* __restrict__ B,
              const float* __restrict__ bias, float* __restrict__ C, int M, int N, int K) {
    __shared__ float As[BK][BM];
    __shared__ float Bs[BK][BN];
    const int tid = threadIdx.x;
    const int tr = tid / 16, tc = tid % 16;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int step = 0; step < (BM * BK) / GEMM_THREADS; ++step) {
            const int e = tid + step * GEMM_THREADS;
            const int r = e / BK, kk = e % BK;
            const int gk = k0 + kk;
            const int ga = row0 + r, gb = col0 + r;
            As[kk][r] = (ga < M && gk < K) ? A[(int64_t)ga * K + gk] : 0.0f;
            Bs[kk][r] = (gb < N && gk < K) ? B[(int64_t)gb * K + gk] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[kk][tr + 16 * i];
#pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[kk][tc + 16 * j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = row0 + tr + 16 * i;
        if (r >= M) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int c = col0 + tc + 16 * j;
            if (c >= N) continue;
            float v = acc[i][j] + bias[c];
            if (EPILOGUE == 1) v = fmaxf(v, 0.0f);
            if (EPILOGUE == 2) v = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
            C[(int64_t)r * N + c] = v;
        }
    }
}

template <int EPILOGUE>
static void launch_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                          torch::Tensor& y) {
    const int M = (int)x.size(0), K = (int)x.size(1), N = (int)w.size(0);
    if (M == 0 || N == 0) return;
    const dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
    sgemm_nt_bias<EPILOGUE><<<grid, GEMM_THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(), M, N, K);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

torch::Tensor mlp_gelu_forward(torch::Tensor x, torch::Tensor w1, torch::Tensor b1,
                               torch::Tensor w2, torch::Tensor b2) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.scalar_type() == torch::kFloat32,
                "2-D float32 CUDA input");
    TORCH_CHECK(w1.dim() == 2 && w1.size(1) == x.size(1) && b1.numel() == w1.size(0) &&
                w2.dim() == 2 && w2.size(1) == w1.size(0) && b2.numel() == w2.size(0),
                "parameter shapes");
    x = x.contiguous();
    w1 = w1.contiguous();
    b1 = b1.contiguous();
    w2 = w2.contiguous();
    b2 = b2.contiguous();
    auto hidden = torch::empty({x.size(0), w1.size(0)}, x.options());
    auto y = torch::empty({x.size(0), w2.size(0)}, x.options());
    launch_linear<2>(x, w1, b1, hidden);
    launch_linear<0>(hidden, w2, b2, y);
    return y;
}
"""

_ext = load_inline(name="mlp_gelu_cuda_ext",
                   cpp_sources="torch::Tensor mlp_gelu_forward(torch::Tensor x, torch::Tensor w1, torch::Tensor b1, torch::Tensor w2, torch::Tensor b2);",
                   cuda_sources=cuda_source, functions=["mlp_gelu_forward"],
                   extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.fc2 = nn.Linear(hidden_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.mlp_gelu_forward(x, self.fc1.weight, self.fc1.bias, self.fc2.weight,
                                     self.fc2.bias)
