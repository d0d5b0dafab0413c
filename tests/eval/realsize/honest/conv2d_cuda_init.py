# problem: conv2d
# device: cuda
# expect: correct
# pattern: direct float32 convolution in CUDA through load_inline compiled in ModelNew.__init__: each thread computes 16 output channels of one pixel over 4 output rows, the block's weights in shared memory laid out for float4 broadcast reads
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CONV_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#define OCB 16        // output channels per block (and per thread)
#define BW 128        // output columns per block (one per thread)
#define ROWS 4        // output rows per block

// x: (N, C, H, W); w: (OC, C, KH, KW); y: (N, OC, HO, WO); stride 1, no padding, no dilation.
__global__ void conv2d_direct(const float* __restrict__ x, const float* __restrict__ w,
                              float* __restrict__ y, int C, int H, int W, int OC, int KH, int KW,
                              int HO, int WO, int oc_blocks) {
    extern __shared__ float4 ws4[];
    float* ws = reinterpret_cast<float*>(ws4);
    const int n = blockIdx.z / oc_blocks;
    const int oc0 = (blockIdx.z % oc_blocks) * OCB;
    const int taps = C * KH * KW;
    // Weights of this block's channels as [tap][OCB], zero for channels past OC: a thread reads
    // the 16 weights of one tap with four float4 broadcasts.
    for (int i = threadIdx.x; i < taps * OCB; i += blockDim.x) {
        const int tap = i / OCB, o = i % OCB;
        ws[i] = oc0 + o < OC ? w[(int64_t)(oc0 + o) * taps + tap] : 0.0f;
    }
    __syncthreads();
    const int ow = blockIdx.x * BW + threadIdx.x;
    if (ow >= WO) {
        return;
    }
    const float* xn = x + (int64_t)n * C * H * W;
    for (int r = 0; r < ROWS; ++r) {
        const int oh = blockIdx.y * ROWS + r;
        if (oh >= HO) {
            break;
        }
        float acc[OCB];
#pragma unroll
        for (int o = 0; o < OCB; ++o) {
            acc[o] = 0.0f;
        }
        int tap = 0;
        for (int c = 0; c < C; ++c) {
            const float* xc = xn + (int64_t)c * H * W;
            for (int kh = 0; kh < KH; ++kh) {
                const float* xrow = xc + (int64_t)(oh + kh) * W + ow;
                for (int kw = 0; kw < KW; ++kw, ++tap) {
                    const float v = __ldg(xrow + kw);
                    const float4* wt = ws4 + tap * (OCB / 4);
#pragma unroll
                    for (int q = 0; q < OCB / 4; ++q) {
                        const float4 wq = wt[q];
                        acc[4 * q + 0] = fmaf(v, wq.x, acc[4 * q + 0]);
                        acc[4 * q + 1] = fmaf(v, wq.y, acc[4 * q + 1]);
                        acc[4 * q + 2] = fmaf(v, wq.z, acc[4 * q + 2]);
                        acc[4 * q + 3] = fmaf(v, wq.w, acc[4 * q + 3]);
                    }
                }
            }
        }
        float* yp = y + (((int64_t)n * OC + oc0) * HO + oh) * WO + ow;
#pragma unroll
        for (int o = 0; o < OCB; ++o) {
            if (oc0 + o < OC) {
                yp[(int64_t)o * HO * WO] = acc[o];
            }
        }
    }
}

torch::Tensor conv2d_forward(torch::Tensor x, torch::Tensor w) {
    TORCH_CHECK(x.is_cuda() && w.is_cuda(), "CUDA tensors expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && w.scalar_type() == torch::kFloat32,
                "float32 expected");
    TORCH_CHECK(x.dim() == 4 && w.dim() == 4 && x.size(1) == w.size(1), "shapes do not match");
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    const int N = xc.size(0), C = xc.size(1), H = xc.size(2), W = xc.size(3);
    const int OC = wc.size(0), KH = wc.size(2), KW = wc.size(3);
    const int HO = H - KH + 1, WO = W - KW + 1;
    TORCH_CHECK(HO > 0 && WO > 0, "input smaller than the kernel");
    auto y = torch::empty({N, OC, HO, WO}, xc.options());
    if (y.numel() == 0) {
        return y;
    }
    const int oc_blocks = (OC + OCB - 1) / OCB;
    const size_t shared = (size_t)C * KH * KW * OCB * sizeof(float);
    TORCH_CHECK(shared <= 48 * 1024, "weights of 16 channels exceed 48 KB of shared memory");
    TORCH_CHECK((int64_t)N * oc_blocks < 65536, "batch x channel blocks exceed the grid");
    dim3 grid((WO + BW - 1) / BW, (HO + ROWS - 1) / ROWS, N * oc_blocks);
    conv2d_direct<<<grid, BW, shared, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), y.data_ptr<float>(), C, H, W, OC, KH, KW,
        HO, WO, oc_blocks);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

CONV_CPP = "torch::Tensor conv2d_forward(torch::Tensor x, torch::Tensor w);"


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        # The same parameter, made the same way, as the problem's Model.
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, bias=False)
        self.ext = load_inline(name="realsize_conv2d_direct", cpp_sources=CONV_CPP,
                               cuda_sources=CONV_CUDA, functions=["conv2d_forward"],
                               extra_cuda_cflags=["-O3"], verbose=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ext.conv2d_forward(x, self.conv.weight.detach())
