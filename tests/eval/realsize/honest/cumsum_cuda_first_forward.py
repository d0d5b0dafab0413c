# problem: cumsum
# device: cuda
# expect: correct
# pattern: CUDA row scan through load_inline compiled on the first forward call: one 1024-thread block per row, 4096-element tiles staged in shared memory, per-thread float4 scans, warp-shuffle block scan, carry between tiles
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SCAN_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#define THREADS 1024
#define PER_THREAD 4
#define TILE (THREADS * PER_THREAD)
#define WARPS (THREADS / 32)

__global__ void scan_rows(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
    __shared__ float4 tile4[THREADS];
    __shared__ float warp_total[WARPS];
    __shared__ float carry_s;
    float* tile = reinterpret_cast<float*>(tile4);
    const float* xr = x + (int64_t)blockIdx.x * cols;
    float* yr = y + (int64_t)blockIdx.x * cols;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid == 0) {
        carry_s = 0.0f;
    }
    for (int64_t t0 = 0; t0 < cols; t0 += TILE) {
        // Coalesced loads into shared memory (zeros past the row's end).
        for (int k = 0; k < PER_THREAD; ++k) {
            const int64_t j = t0 + k * THREADS + tid;
            tile[k * THREADS + tid] = j < cols ? xr[j] : 0.0f;
        }
        __syncthreads();
        // Each thread scans its four consecutive elements.
        float4 v = tile4[tid];
        v.y += v.x;
        v.z += v.y;
        v.w += v.z;
        // Inclusive scan of the threads' totals within the warp.
        float incl = v.w;
        for (int off = 1; off < 32; off <<= 1) {
            const float other = __shfl_up_sync(0xffffffff, incl, off);
            if (lane >= off) {
                incl += other;
            }
        }
        if (lane == 31) {
            warp_total[warp] = incl;
        }
        __syncthreads();
        if (warp == 0) {
            float w = warp_total[lane];
            for (int off = 1; off < 32; off <<= 1) {
                const float other = __shfl_up_sync(0xffffffff, w, off);
                if (lane >= off) {
                    w += other;
                }
            }
            warp_total[lane] = w;  // inclusive over warps
        }
        __syncthreads();
        const float carry = carry_s;
        const float before = carry + (warp > 0 ? warp_total[warp - 1] : 0.0f) + (incl - v.w);
        v.x += before;
        v.y += before;
        v.z += before;
        v.w += before;
        tile4[tid] = v;
        __syncthreads();
        for (int k = 0; k < PER_THREAD; ++k) {
            const int64_t j = t0 + k * THREADS + tid;
            if (j < cols) {
                yr[j] = tile[k * THREADS + tid];
            }
        }
        if (tid == THREADS - 1) {
            carry_s = v.w;
        }
        __syncthreads();
    }
}

torch::Tensor scan_last(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t cols = xc.size(-1);
    const int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
    if (rows == 0) {
        return y;
    }
    TORCH_CHECK(rows < (1LL << 31), "too many rows");
    scan_rows<<<(unsigned int)rows, THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

SCAN_CPP = "torch::Tensor scan_last(torch::Tensor x);"


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self._ext = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._ext is None:
            self._ext = load_inline(name="realsize_scan_rows", cpp_sources=SCAN_CPP,
                                    cuda_sources=SCAN_CUDA, functions=["scan_last"],
                                    extra_cuda_cflags=["-O3"], verbose=False)
        dim = self.dim % x.dim()
        if dim == x.dim() - 1:
            return self._ext.scan_last(x)
        # Another dimension: scanned as the last one of a transposed copy.
        moved = x.movedim(dim, -1).contiguous()
        return self._ext.scan_last(moved).movedim(-1, dim).contiguous()
