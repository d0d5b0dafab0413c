# problem: layernorm
# kind: honest
# lang: cuda
"""LayerNorm as two CUDA kernels through load_inline, for few very long samples: a grid over
(sample, chunk) computes per-chunk sums and sums of squares (float per thread, double across
threads), then a second grid over the same chunks re-derives its sample's mean and rstd from the
partials (in double) and normalizes with the affine parameters, so all SMs work on each sample."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

constexpr int THREADS = 256;
constexpr int64_t CHUNK = 8192;  // elements of one sample per block

__device__ __forceinline__ double warp_sum(double v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffff, v, offset);
    return v;
}

__global__ void partial_stats(const float* __restrict__ x, double2* __restrict__ partials,
                              int64_t n, int chunks) {
    const int chunk = blockIdx.x, row = blockIdx.y;
    const float* xr = x + (int64_t)row * n;
    const int64_t begin = (int64_t)chunk * CHUNK;
    const int64_t end = min(begin + CHUNK, n);
    float s = 0.0f, q = 0.0f;
    for (int64_t i = begin + threadIdx.x; i < end; i += THREADS) {
        const float v = xr[i];
        s += v;
        q += v * v;
    }
    double ds = warp_sum((double)s), dq = warp_sum((double)q);
    __shared__ double shared[2][THREADS / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) { shared[0][warp] = ds; shared[1][warp] = dq; }
    __syncthreads();
    if (warp == 0) {
        ds = lane < THREADS / 32 ? shared[0][lane] : 0.0;
        dq = lane < THREADS / 32 ? shared[1][lane] : 0.0;
        ds = warp_sum(ds);
        dq = warp_sum(dq);
        if (lane == 0) partials[(int64_t)row * chunks + chunk] = make_double2(ds, dq);
    }
}

__global__ void normalize(const float* __restrict__ x, const float* __restrict__ w,
                          const float* __restrict__ b, float* __restrict__ y,
                          const double2* __restrict__ partials, int64_t n, int chunks, double eps) {
    const int chunk = blockIdx.x, row = blockIdx.y;
    __shared__ float stats[2];
    if (threadIdx.x < 32) {
        double s = 0.0, q = 0.0;
        for (int c = threadIdx.x; c < chunks; c += 32) {
            const double2 p = partials[(int64_t)row * chunks + c];
            s += p.x;
            q += p.y;
        }
        s = warp_sum(s);
        q = warp_sum(q);
        if (threadIdx.x == 0) {
            const double mean = s / (double)n;
            const double var = fmax(q / (double)n - mean * mean, 0.0);
            stats[0] = (float)mean;
            stats[1] = (float)(1.0 / sqrt(var + eps));
        }
    }
    __syncthreads();
    const float mean = stats[0], rstd = stats[1];
    const float* xr = x + (int64_t)row * n;
    float* yr = y + (int64_t)row * n;
    const int64_t begin = (int64_t)chunk * CHUNK;
    const int64_t end = min(begin + CHUNK, n);
    for (int64_t i = begin + threadIdx.x; i < end; i += THREADS)
        yr[i] = (xr[i] - mean) * rstd * w[i] + b[i];
}

torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias,
                                double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA input");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    const int64_t n = weight.numel();
    TORCH_CHECK(n > 0 && bias.numel() == n && x.numel() % n == 0, "parameter shapes");
    const int64_t rows = x.numel() / n;
    auto y = torch::empty_like(x);
    if (rows == 0) return y;
    const int chunks = (int)((n + CHUNK - 1) / CHUNK);
    auto partials = torch::empty({rows * chunks * 2}, x.options().dtype(torch::kFloat64));
    auto stream = c10::cuda::getCurrentCUDAStream();
    const dim3 grid(chunks, (unsigned)rows);
    double2* p = reinterpret_cast<double2*>(partials.data_ptr<double>());
    partial_stats<<<grid, THREADS, 0, stream>>>(x.data_ptr<float>(), p, n, chunks);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    normalize<<<grid, THREADS, 0, stream>>>(x.data_ptr<float>(), weight.data_ptr<float>(),
                                            bias.data_ptr<float>(), y.data_ptr<float>(), p, n,
                                            chunks, eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(name="layernorm_cuda_ext",
                   cpp_sources="torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps);",
                   cuda_sources=cuda_source, functions=["layernorm_forward"],
                   extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.layernorm_forward(x, self.ln.weight, self.ln.bias, self.ln.eps)
