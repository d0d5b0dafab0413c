# problem: sum_dim
# device: cuda
# expect: correct
# pattern: CUDA sum over a middle dimension through load_inline at import: the tensor seen as (outer, reduced, inner), 32 inner columns by 8 reduced-row slices per block, coalesced loads, partial sums merged in shared memory
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SUM_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#define COLS 32
#define SLICES 8

__global__ void sum_middle(const float* __restrict__ x, float* __restrict__ y, int64_t reduced,
                           int64_t inner, int64_t col_blocks) {
    __shared__ float part[SLICES][COLS + 1];
    const int64_t outer = blockIdx.x / col_blocks;
    const int64_t col = (blockIdx.x % col_blocks) * COLS + threadIdx.x;
    float acc = 0.0f;
    if (col < inner) {
        const float* base = x + outer * reduced * inner + col;
        // Four independent partial sums per thread: more loads in flight, shorter float32 chains.
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        int64_t r = threadIdx.y;
        for (; r + 3 * SLICES < reduced; r += 4 * SLICES) {
            a0 += base[r * inner];
            a1 += base[(r + SLICES) * inner];
            a2 += base[(r + 2 * SLICES) * inner];
            a3 += base[(r + 3 * SLICES) * inner];
        }
        for (; r < reduced; r += SLICES) {
            a0 += base[r * inner];
        }
        acc = (a0 + a1) + (a2 + a3);
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < inner) {
        float total = 0.0f;
        for (int s = 0; s < SLICES; ++s) {
            total += part[s][threadIdx.x];
        }
        y[outer * inner + col] = total;
    }
}

torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    auto xc = x.contiguous();
    dim = dim < 0 ? dim + xc.dim() : dim;
    TORCH_CHECK(dim >= 0 && dim < xc.dim(), "dim out of range");
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= xc.size(d);
    for (int64_t d = dim + 1; d < xc.dim(); ++d) inner *= xc.size(d);
    const int64_t reduced = xc.size(dim);
    auto sizes = xc.sizes().vec();
    sizes[dim] = 1;
    auto y = torch::empty(sizes, xc.options());
    if (y.numel() == 0) {
        return y;
    }
    const int64_t col_blocks = (inner + COLS - 1) / COLS;
    const int64_t blocks = outer * col_blocks;
    TORCH_CHECK(blocks < (1LL << 31), "too many blocks");
    dim3 threads(COLS, SLICES);
    sum_middle<<<(unsigned int)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), reduced, inner, col_blocks);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

SUM_CPP = "torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim);"

sum_ext = load_inline(name="realsize_sum_middle", cpp_sources=SUM_CPP, cuda_sources=SUM_CUDA,
                      functions=["sum_dim_forward"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum_ext.sum_dim_forward(x, self.dim)
