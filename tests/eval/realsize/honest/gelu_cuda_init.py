# problem: gelu
# device: cuda
# expect: correct
# pattern: CUDA exact-erf GELU through load_inline compiled in ModelNew.__init__: float4 loads and stores in a grid-stride loop, scalar tail
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

GELU_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

__device__ __forceinline__ float gelu(float v) {
    return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
}

__global__ void gelu_vec4(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)gridDim.x * blockDim.x) {
        float4 v = x[i];
        v.x = gelu(v.x);
        v.y = gelu(v.y);
        v.z = gelu(v.z);
        v.w = gelu(v.w);
        y[i] = v;
    }
}

__global__ void gelu_scalar(const float* __restrict__ x, float* __restrict__ y, int64_t start,
                            int64_t n) {
    for (int64_t i = start + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        y[i] = gelu(x[i]);
    }
}

torch::Tensor gelu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t n = xc.numel();
    if (n == 0) {
        return y;
    }
    auto stream = at::cuda::getCurrentCUDAStream();
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int threads = 256;
    // The allocator's blocks are 512-byte aligned, so a contiguous tensor's data is float4-aligned
    // unless it is a view with an odd offset: checked, not assumed.
    const bool aligned = (reinterpret_cast<uintptr_t>(xc.data_ptr<float>()) % 16 == 0) &&
                         (reinterpret_cast<uintptr_t>(y.data_ptr<float>()) % 16 == 0);
    const int64_t n4 = aligned ? n / 4 : 0;
    if (n4 > 0) {
        const int64_t want = (n4 + threads - 1) / threads;
        const int blocks = (int)std::min<int64_t>(want, (int64_t)sms * 32);
        gelu_vec4<<<blocks, threads, 0, stream>>>(
            reinterpret_cast<const float4*>(xc.data_ptr<float>()),
            reinterpret_cast<float4*>(y.data_ptr<float>()), n4);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    const int64_t rest = n - n4 * 4;
    if (rest > 0) {
        const int64_t want = (rest + threads - 1) / threads;
        const int blocks = (int)std::min<int64_t>(want, (int64_t)sms * 32);
        gelu_scalar<<<blocks, threads, 0, stream>>>(xc.data_ptr<float>(), y.data_ptr<float>(),
                                                    n4 * 4, n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    return y;
}
"""

GELU_CPP = "torch::Tensor gelu_forward(torch::Tensor x);"


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = load_inline(name="realsize_gelu_erf", cpp_sources=GELU_CPP,
                               cuda_sources=GELU_CUDA, functions=["gelu_forward"],
                               extra_cuda_cflags=["-O3"], verbose=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ext.gelu_forward(x)
