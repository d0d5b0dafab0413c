# problem: fused_elementwise
# kind: honest
# lang: cuda
"""gelu(x + bias) * sigmoid(y) as one CUDA kernel through load_inline (grid-stride loop)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

__global__ void fused_gelu_sigmoid(const float* __restrict__ x, const float* __restrict__ y,
                                   const float* __restrict__ bias, float* __restrict__ out,
                                   int64_t n, int64_t dim) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float h = x[i] + bias[i % dim];
        const float gelu = 0.5f * h * (1.0f + erff(h * 0.70710678118654752f));
        out[i] = gelu / (1.0f + __expf(-y[i]));
    }
}

torch::Tensor fused_forward(torch::Tensor x, torch::Tensor y, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA input");
    x = x.contiguous(); y = y.contiguous(); bias = bias.contiguous();
    auto out = torch::empty_like(x);
    const int64_t n = x.numel();
    const int threads = 256;
    const int blocks = (int)std::min<int64_t>((n + threads - 1) / threads, 132 * 32);
    fused_gelu_sigmoid<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(),
        n, bias.numel());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

_ext = load_inline(name="fused_gelu_sigmoid_ext",
                   cpp_sources="torch::Tensor fused_forward(torch::Tensor x, torch::Tensor y, torch::Tensor bias);",
                   cuda_sources=cuda_source, functions=["fused_forward"],
                   extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return _ext.fused_forward(x, y, self.bias)
