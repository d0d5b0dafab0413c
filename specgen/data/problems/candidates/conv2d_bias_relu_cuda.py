# problem: conv2d_bias_relu
# kind: honest
# lang: cuda
"""Conv2d ("same" padding, stride 1) + bias + ReLU as one CUDA kernel through load_inline: a
direct convolution where a 16 x 16 thread block owns a 16 x 16 output tile for 16 output
channels of one image; per input channel the zero-padded input tile and the 16 filters are staged
in shared memory and every thread accumulates its pixel for all 16 channels in registers; bias
and ReLU applied on the way out."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

constexpr int TILE = 16, OCB = 16;

template <int KS>
__global__ void __launch_bounds__(TILE * TILE)
conv_bias_relu_kernel(const float* __restrict__ x, const float* __restrict__ w,
                      const float* __restrict__ bias, float* __restrict__ y,
                      int C, int H, int W, int OC, int oc_groups) {
    constexpr int PAD = KS / 2, IN = TILE + KS - 1;
    __shared__ float tile[IN][IN + 1];
    __shared__ float filt[OCB][KS * KS];
    const int b = blockIdx.z / oc_groups, oc0 = (blockIdx.z % oc_groups) * OCB;
    const int oh0 = blockIdx.y * TILE, ow0 = blockIdx.x * TILE;
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * TILE + tx;
    float acc[OCB];
#pragma unroll
    for (int o = 0; o < OCB; ++o) acc[o] = 0.0f;
    for (int c = 0; c < C; ++c) {
        const float* plane = x + ((int64_t)b * C + c) * H * W;
        for (int e = tid; e < IN * IN; e += TILE * TILE) {
            const int ih = oh0 - PAD + e / IN, iw = ow0 - PAD + e % IN;
            tile[e / IN][e % IN] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? plane[ih * W + iw] : 0.0f;
        }
        for (int e = tid; e < OCB * KS * KS; e += TILE * TILE) {
            const int o = e / (KS * KS), oc = oc0 + o;
            filt[o][e % (KS * KS)] = oc < OC ? w[((int64_t)oc * C + c) * KS * KS + e % (KS * KS)] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kh = 0; kh < KS; ++kh)
#pragma unroll
            for (int kw = 0; kw < KS; ++kw) {
                const float v = tile[ty + kh][tx + kw];
#pragma unroll
                for (int o = 0; o < OCB; ++o) acc[o] = fmaf(filt[o][kh * KS + kw], v, acc[o]);
            }
        __syncthreads();
    }
    const int oh = oh0 + ty, ow = ow0 + tx;
    if (oh >= H || ow >= W) return;
#pragma unroll
    for (int o = 0; o < OCB; ++o) {
        const int oc = oc0 + o;
        if (oc < OC) y[(((int64_t)b * OC + oc) * H + oh) * W + ow] = fmaxf(acc[o] + bias[oc], 0.0f);
    }
}

torch::Tensor conv2d_bias_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 4 && x.scalar_type() == torch::kFloat32,
                "4-D float32 CUDA input");
    TORCH_CHECK(weight.dim() == 4 && weight.size(1) == x.size(1) && weight.size(2) == weight.size(3)
                && bias.numel() == weight.size(0), "parameter shapes");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    const int B = (int)x.size(0), C = (int)x.size(1), H = (int)x.size(2), W = (int)x.size(3);
    const int OC = (int)weight.size(0), KS = (int)weight.size(2);
    auto y = torch::empty({B, OC, H, W}, x.options());
    if (B == 0 || OC == 0 || H == 0 || W == 0) return y;
    const int groups = (OC + OCB - 1) / OCB;
    const dim3 grid((W + TILE - 1) / TILE, (H + TILE - 1) / TILE, B * groups);
    const dim3 block(TILE, TILE);
    auto stream = c10::cuda::getCurrentCUDAStream();
    const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>(), *bp = bias.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    switch (KS) {
        case 1: conv_bias_relu_kernel<1><<<grid, block, 0, stream>>>(xp, wp, bp, yp, C, H, W, OC, groups); break;
        case 3: conv_bias_relu_kernel<3><<<grid, block, 0, stream>>>(xp, wp, bp, yp, C, H, W, OC, groups); break;
        case 5: conv_bias_relu_kernel<5><<<grid, block, 0, stream>>>(xp, wp, bp, yp, C, H, W, OC, groups); break;
        case 7: conv_bias_relu_kernel<7><<<grid, block, 0, stream>>>(xp, wp, bp, yp, C, H, W, OC, groups); break;
        default: TORCH_CHECK(false, "kernel size must be 1, 3, 5 or 7");
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(name="conv2d_bias_relu_cuda_ext",
                   cpp_sources="torch::Tensor conv2d_bias_relu_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);",
                   cuda_sources=cuda_source, functions=["conv2d_bias_relu_forward"],
                   extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.conv2d_bias_relu_forward(x, self.conv.weight, self.conv.bias)
