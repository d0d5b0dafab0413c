# problem: softmax
# kind: honest
# lang: cuda
"""Softmax as a CUDA kernel through load_inline: one thread block per row, block-wide max and sum
reductions in shared memory, the row read three times from global memory (L2-resident rows)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <cfloat>

__device__ float block_reduce(float value, float* shared, bool take_max) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int offset = 16; offset > 0; offset /= 2) {
        float other = __shfl_down_sync(0xffffffff, value, offset);
        value = take_max ? fmaxf(value, other) : value + other;
    }
    if (lane == 0) shared[warp] = value;
    __syncthreads();
    const int warps = (blockDim.x + 31) / 32;
    value = threadIdx.x < warps ? shared[threadIdx.x] : (take_max ? -FLT_MAX : 0.0f);
    if (warp == 0) {
        for (int offset = 16; offset > 0; offset /= 2) {
            float other = __shfl_down_sync(0xffffffff, value, offset);
            value = take_max ? fmaxf(value, other) : value + other;
        }
        if (lane == 0) shared[0] = value;
    }
    __syncthreads();
    value = shared[0];
    __syncthreads();
    return value;
}

__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
    __shared__ float shared[32];
    const float* row = x + blockIdx.x * cols;
    float* out = y + blockIdx.x * cols;
    float local_max = -FLT_MAX;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) local_max = fmaxf(local_max, row[i]);
    const float row_max = block_reduce(local_max, shared, true);
    float local_sum = 0.0f;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) local_sum += __expf(row[i] - row_max);
    const float inv_sum = 1.0f / block_reduce(local_sum, shared, false);
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) out[i] = __expf(row[i] - row_max) * inv_sum;
}

torch::Tensor softmax_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.scalar_type() == torch::kFloat32, "2-D float32 CUDA input");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    softmax_rows<<<x.size(0), 1024, 0, c10::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), x.size(1));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(name="softmax_rows_ext", cpp_sources="torch::Tensor softmax_forward(torch::Tensor x);",
                   cuda_sources=cuda_source, functions=["softmax_forward"],
                   extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.softmax_forward(x)
