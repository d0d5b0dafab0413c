# problem: linear_relu
# device: cuda
# expect: correct
# pattern: CUDA shared-memory tiled SGEMM (16x16 tiles, padded to avoid bank conflicts) with bias+ReLU epilogue, via load_inline
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

linear_relu_cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#define TILE 16

// y[m, n] = relu(sum_k x[m, k] * w[n, k] + b[n]); x is (M, K), w is (N, K), both row-major.
__global__ void linear_relu_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                   const float* __restrict__ b, float* __restrict__ y,
                                   int M, int N, int K) {
    __shared__ float xs[TILE][TILE + 1];
    __shared__ float ws[TILE][TILE + 1];
    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;        // index into M
    const int col = blockIdx.x * TILE + tx;        // index into N
    const int w_row = blockIdx.x * TILE + ty;      // the W row this thread loads
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        const int kk = k0 + tx;
        xs[ty][tx] = (row < M && kk < K) ? x[(int64_t)row * K + kk] : 0.0f;
        ws[ty][tx] = (w_row < N && kk < K) ? w[(int64_t)w_row * K + kk] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int t = 0; t < TILE; ++t) {
            acc += xs[ty][t] * ws[tx][t];
        }
        __syncthreads();
    }
    if (row < M && col < N) {
        const float v = acc + b[col];
        y[(int64_t)row * N + col] = v > 0.0f ? v : 0.0f;
    }
}

torch::Tensor linear_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "CUDA tensors expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 expected");
    TORCH_CHECK(x.dim() == 2 && weight.dim() == 2, "2-D x and weight expected");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    const int M = (int)xc.size(0);
    const int K = (int)xc.size(1);
    const int N = (int)wc.size(0);
    TORCH_CHECK(wc.size(1) == K, "weight has the wrong inner size");
    TORCH_CHECK(bc.numel() == N, "bias has the wrong size");
    auto y = torch::empty({xc.size(0), wc.size(0)}, xc.options());
    if (M == 0 || N == 0) {
        return y;
    }
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    linear_relu_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(), y.data_ptr<float>(),
        M, N, K);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

linear_relu_ext = load_inline(
    name="corpus_linear_relu_cuda",
    cpp_sources="torch::Tensor linear_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);",
    cuda_sources=linear_relu_cuda_source,
    functions=["linear_relu_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_relu_ext.linear_relu_forward(x, self.linear.weight.detach(),
                                                   self.linear.bias.detach())
