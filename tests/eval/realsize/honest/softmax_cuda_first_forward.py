# problem: softmax
# device: cuda
# expect: correct
# pattern: CUDA softmax through load_inline compiled on the first forward call (not at import): one 1024-thread block per row, per-thread online max/sum, warp-shuffle merge, then a write pass
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SOFTMAX_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cfloat>

#define THREADS 1024

// Merge two (max, sum of exp(x - max)) pairs.
__device__ __forceinline__ void merge(float& m, float& s, float om, float os) {
    const float nm = fmaxf(m, om);
    if (nm == -INFINITY) {
        return;
    }
    s = s * expf(m - nm) + os * expf(om - nm);
    m = nm;
}

__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
    __shared__ float wm[THREADS / 32];
    __shared__ float ws[THREADS / 32];
    const float* xr = x + (int64_t)blockIdx.x * cols;
    float* yr = y + (int64_t)blockIdx.x * cols;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    float m = -INFINITY, s = 0.0f;
    for (int64_t j = tid; j < cols; j += THREADS) {
        const float v = xr[j];
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        const float om = __shfl_xor_sync(0xffffffff, m, off);
        const float os = __shfl_xor_sync(0xffffffff, s, off);
        merge(m, s, om, os);
    }
    if (lane == 0) {
        wm[warp] = m;
        ws[warp] = s;
    }
    __syncthreads();
    if (warp == 0) {
        m = lane < THREADS / 32 ? wm[lane] : -INFINITY;
        s = lane < THREADS / 32 ? ws[lane] : 0.0f;
        for (int off = 16; off > 0; off >>= 1) {
            const float om = __shfl_xor_sync(0xffffffff, m, off);
            const float os = __shfl_xor_sync(0xffffffff, s, off);
            merge(m, s, om, os);
        }
        if (lane == 0) {
            wm[0] = m;
            ws[0] = s;
        }
    }
    __syncthreads();
    const float row_max = wm[0];
    const float total = ws[0];
    for (int64_t j = tid; j < cols; j += THREADS) {
        yr[j] = expf(xr[j] - row_max) / total;
    }
}

torch::Tensor softmax_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t cols = xc.size(-1);
    const int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
    if (rows == 0) {
        return y;
    }
    softmax_rows<<<(unsigned int)rows, THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

SOFTMAX_CPP = "torch::Tensor softmax_forward(torch::Tensor x);"


def _build():
    return load_inline(name="realsize_softmax_rows", cpp_sources=SOFTMAX_CPP,
                       cuda_sources=SOFTMAX_CUDA, functions=["softmax_forward"],
                       extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self._ext = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._ext is None:
            self._ext = _build()
        return self._ext.softmax_forward(x)
