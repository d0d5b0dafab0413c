# problem: sum_dim
# device: cuda
# expect: correct
# pattern: CUDA reduction over a middle dimension via load_inline: one thread per output element, coalesced along the inner dimension
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

sum_dim_cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <vector>

__global__ void sum_middle_kernel(const float* __restrict__ x, float* __restrict__ y,
                                  int64_t outer, int64_t reduced, int64_t inner) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= outer * inner) {
        return;
    }
    const int64_t o = idx / inner;
    const int64_t i = idx % inner;
    const float* p = x + o * reduced * inner + i;
    float acc = 0.0f;
    for (int64_t r = 0; r < reduced; ++r) {
        acc += p[r * inner];
    }
    y[idx] = acc;
}

torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda(), "sum_dim_forward: CUDA tensor expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "sum_dim_forward: float32 expected");
    auto xc = x.contiguous();
    const int64_t nd = xc.dim();
    if (dim < 0) {
        dim += nd;
    }
    TORCH_CHECK(dim >= 0 && dim < nd, "sum_dim_forward: dim out of range");
    int64_t outer = 1;
    int64_t inner = 1;
    std::vector<int64_t> out_shape;
    for (int64_t d = 0; d < nd; ++d) {
        if (d < dim) outer *= xc.size(d);
        if (d > dim) inner *= xc.size(d);
        if (d != dim) out_shape.push_back(xc.size(d));
    }
    const int64_t reduced = xc.size(dim);
    auto y = torch::empty(out_shape, xc.options());
    const int64_t total = outer * inner;
    if (total == 0) {
        return y;
    }
    const int threads = 256;
    const int64_t blocks = (total + threads - 1) / threads;
    sum_middle_kernel<<<(unsigned int)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), outer, reduced, inner);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

sum_dim_ext = load_inline(
    name="corpus_sum_dim_cuda",
    cpp_sources="torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim);",
    cuda_sources=sum_dim_cuda_source,
    functions=["sum_dim_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum_dim_ext.sum_dim_forward(x, self.dim)
