# problem: sum_reduction
# kind: honest
# lang: cuda
"""Sum over one dimension as a CUDA kernel through load_inline: the tensor viewed as (outer,
reduced, inner); a block of 32 x 8 threads owns 32 inner columns of one outer row, each warp reads
whole 128-byte rows along the contiguous inner axis while the 8 warps split the reduced axis, and
the 8 partial sums meet in shared memory."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <vector>

constexpr int COLS = 32, SPLIT = 8;

__global__ void sum_dim_kernel(const float* __restrict__ x, float* __restrict__ y,
                               int64_t reduced, int64_t inner) {
    const int64_t col = (int64_t)blockIdx.x * COLS + threadIdx.x;
    const int64_t row = blockIdx.y;
    float acc = 0.0f;
    if (col < inner) {
        const float* base = x + row * reduced * inner + col;
        for (int64_t r = threadIdx.y; r < reduced; r += SPLIT) acc += base[r * inner];
    }
    __shared__ float partial[SPLIT][COLS + 1];
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < inner) {
        float total = 0.0f;
#pragma unroll
        for (int s = 0; s < SPLIT; ++s) total += partial[s][threadIdx.x];
        y[row * inner + col] = total;
    }
}

torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.dim() >= 1,
                "float32 CUDA input");
    if (dim < 0) dim += x.dim();
    TORCH_CHECK(dim >= 0 && dim < x.dim(), "dim out of range");
    x = x.contiguous();
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
    sizes[dim] = 1;
    auto y = torch::empty(sizes, x.options());
    if (outer == 0 || inner == 0) return y;
    const dim3 grid((unsigned)((inner + COLS - 1) / COLS), (unsigned)outer);
    sum_dim_kernel<<<grid, dim3(COLS, SPLIT), 0, c10::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), x.size(dim), inner);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(name="sum_reduction_cuda_ext",
                   cpp_sources="torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim);",
                   cuda_sources=cuda_source, functions=["sum_dim_forward"],
                   extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.sum_dim_forward(x, self.dim)
