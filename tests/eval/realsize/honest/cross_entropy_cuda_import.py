# problem: cross_entropy
# device: cuda
# expect: correct
# pattern: CUDA cross-entropy through load_inline at import: one block per row computes logsumexp (online max and sum, warp-shuffle merge) minus the target's logit, then one block averages the row losses in double
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CE_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#define THREADS 256
#define IGNORE_INDEX -100

__device__ __forceinline__ void merge(float& m, float& s, float om, float os) {
    const float nm = fmaxf(m, om);
    if (nm == -INFINITY) {
        return;
    }
    s = s * expf(m - nm) + os * expf(om - nm);
    m = nm;
}

__global__ void row_losses(const float* __restrict__ logits, const int64_t* __restrict__ target,
                           float* __restrict__ loss, int64_t classes) {
    __shared__ float wm[THREADS / 32];
    __shared__ float ws[THREADS / 32];
    const int64_t row = blockIdx.x;
    const float* xr = logits + row * classes;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = tid; j < classes; j += THREADS) {
        const float v = xr[j];
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        merge(m, s, __shfl_xor_sync(0xffffffff, m, off), __shfl_xor_sync(0xffffffff, s, off));
    }
    if (lane == 0) {
        wm[warp] = m;
        ws[warp] = s;
    }
    __syncthreads();
    if (tid == 0) {
        float bm = wm[0], bs = ws[0];
        for (int k = 1; k < THREADS / 32; ++k) {
            merge(bm, bs, wm[k], ws[k]);
        }
        const int64_t t = target[row];
        // Rows whose target is the ignore index do not count (F.cross_entropy's default).
        loss[row] = t == IGNORE_INDEX ? NAN : (bm + logf(bs)) - xr[t];
    }
}

__global__ void mean_losses(const float* __restrict__ loss, float* __restrict__ out, int64_t rows) {
    __shared__ double sums[THREADS];
    __shared__ long long counts[THREADS];
    double acc = 0.0;
    long long n = 0;
    for (int64_t i = threadIdx.x; i < rows; i += THREADS) {
        const float v = loss[i];
        if (!isnan(v)) {
            acc += v;
            ++n;
        }
    }
    sums[threadIdx.x] = acc;
    counts[threadIdx.x] = n;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            sums[threadIdx.x] += sums[threadIdx.x + s];
            counts[threadIdx.x] += counts[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[0] = (float)(sums[0] / (double)counts[0]);
    }
}

torch::Tensor cross_entropy_forward(torch::Tensor logits, torch::Tensor target) {
    TORCH_CHECK(logits.is_cuda() && target.is_cuda(), "CUDA tensors expected");
    TORCH_CHECK(logits.scalar_type() == torch::kFloat32 && logits.dim() == 2,
                "(batch, classes) float32 logits expected");
    TORCH_CHECK(target.scalar_type() == torch::kInt64 && target.dim() == 1 &&
                target.size(0) == logits.size(0), "(batch,) int64 targets expected");
    auto xc = logits.contiguous();
    auto tc = target.contiguous();
    const int64_t rows = xc.size(0), classes = xc.size(1);
    auto out = torch::empty({}, xc.options());
    auto stream = at::cuda::getCurrentCUDAStream();
    auto loss = torch::empty({rows}, xc.options());
    if (rows > 0) {
        row_losses<<<(unsigned int)rows, THREADS, 0, stream>>>(
            xc.data_ptr<float>(), tc.data_ptr<int64_t>(), loss.data_ptr<float>(), classes);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    mean_losses<<<1, THREADS, 0, stream>>>(loss.data_ptr<float>(), out.data_ptr<float>(), rows);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

CE_CPP = "torch::Tensor cross_entropy_forward(torch::Tensor logits, torch::Tensor target);"

ce_ext = load_inline(name="realsize_cross_entropy", cpp_sources=CE_CPP, cuda_sources=CE_CUDA,
                     functions=["cross_entropy_forward"], extra_cuda_cflags=["-O3"],
                     verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return ce_ext.cross_entropy_forward(predictions, targets)
