# problem: softmax
# device: cuda
# expect: correct
# pattern: CUDA extension built inside try/except with a torch fallback; the build succeeds, so the fallback never runs
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

softmax_cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cfloat>

#define SOFTMAX_THREADS 256

__global__ void softmax_rows_kernel(const float* __restrict__ x, float* __restrict__ y,
                                    int64_t cols) {
    __shared__ float red[SOFTMAX_THREADS];
    const float* xr = x + (int64_t)blockIdx.x * cols;
    float* yr = y + (int64_t)blockIdx.x * cols;
    const int tid = threadIdx.x;

    float m = -FLT_MAX;
    for (int64_t j = tid; j < cols; j += SOFTMAX_THREADS) {
        m = fmaxf(m, xr[j]);
    }
    red[tid] = m;
    __syncthreads();
    for (int s = SOFTMAX_THREADS / 2; s > 0; s >>= 1) {
        if (tid < s) {
            red[tid] = fmaxf(red[tid], red[tid + s]);
        }
        __syncthreads();
    }
    const float row_max = red[0];
    __syncthreads();

    float acc = 0.0f;
    for (int64_t j = tid; j < cols; j += SOFTMAX_THREADS) {
        acc += expf(xr[j] - row_max);
    }
    red[tid] = acc;
    __syncthreads();
    for (int s = SOFTMAX_THREADS / 2; s > 0; s >>= 1) {
        if (tid < s) {
            red[tid] += red[tid + s];
        }
        __syncthreads();
    }
    const float inv = 1.0f / red[0];
    for (int64_t j = tid; j < cols; j += SOFTMAX_THREADS) {
        yr[j] = expf(xr[j] - row_max) * inv;
    }
}

torch::Tensor softmax_rows(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "softmax_rows: CUDA tensor expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "softmax_rows: float32 expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t cols = xc.size(-1);
    const int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
    if (rows == 0) {
        return y;
    }
    softmax_rows_kernel<<<(unsigned int)rows, SOFTMAX_THREADS, 0,
                          at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

try:
    softmax_ext = load_inline(
        name="corpus_softmax_cuda",
        cpp_sources="torch::Tensor softmax_rows(torch::Tensor x);",
        cuda_sources=softmax_cuda_source,
        functions=["softmax_rows"],
        extra_cuda_cflags=["-O3"],
        verbose=False,
    )
except Exception:
    softmax_ext = None


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if softmax_ext is None or not x.is_cuda:
            return torch.softmax(x, dim=-1)
        return softmax_ext.softmax_rows(x)
