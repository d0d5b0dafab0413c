# problem: layernorm
# device: cuda
# expect: correct
# pattern: CUDA LayerNorm through load_inline: one block per row, shared-memory tree reductions, two passes
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

layernorm_cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#define LN_THREADS 256

__device__ float block_sum(float v, float* red) {
    const int tid = threadIdx.x;
    red[tid] = v;
    __syncthreads();
    for (int s = LN_THREADS / 2; s > 0; s >>= 1) {
        if (tid < s) {
            red[tid] += red[tid + s];
        }
        __syncthreads();
    }
    const float total = red[0];
    __syncthreads();
    return total;
}

__global__ void layernorm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                 const float* __restrict__ b, float* __restrict__ y,
                                 int64_t cols, float eps) {
    __shared__ float red[LN_THREADS];
    const float* xr = x + (int64_t)blockIdx.x * cols;
    float* yr = y + (int64_t)blockIdx.x * cols;

    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += LN_THREADS) {
        s += xr[j];
    }
    const float mean = block_sum(s, red) / (float)cols;

    float sq = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += LN_THREADS) {
        const float d = xr[j] - mean;
        sq += d * d;
    }
    const float var = block_sum(sq, red) / (float)cols;
    const float rstd = rsqrtf(var + eps);

    for (int64_t j = threadIdx.x; j < cols; j += LN_THREADS) {
        yr[j] = (xr[j] - mean) * rstd * w[j] + b[j];
    }
}

torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias,
                                double eps) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "CUDA tensors expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 input expected");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    const int64_t cols = xc.size(-1);
    TORCH_CHECK(wc.numel() == cols && bc.numel() == cols, "weight/bias size mismatch");
    auto y = torch::empty_like(xc);
    const int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
    if (rows == 0) {
        return y;
    }
    layernorm_kernel<<<(unsigned int)rows, LN_THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(), y.data_ptr<float>(),
        cols, (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

layernorm_cpp_source = (
    "torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, "
    "torch::Tensor bias, double eps);"
)

layernorm_ext = load_inline(
    name="corpus_layernorm_cuda",
    cpp_sources=layernorm_cpp_source,
    cuda_sources=layernorm_cuda_source,
    functions=["layernorm_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layernorm_ext.layernorm_forward(x, self.norm.weight.detach(),
                                               self.norm.bias.detach(), self.norm.eps)
