# problem: matmul_bias_relu
# kind: honest
# lang: triton
"""Linear + ReLU in Triton: a tiled matmul (fp32, IEEE precision) with bias and ReLU fused into
the epilogue."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def linear_relu_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K,
                       stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :] * stride_xk,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        # W is (N, K); load a (BLOCK_K, BLOCK_N) tile of W^T
        w = tl.load(w_ptr + rn[None, :] * stride_wn + kk[:, None] * stride_wk,
                    mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0)
        acc += tl.dot(x, w, input_precision="ieee")
    bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0)
    acc = tl.maximum(acc + bias[None, :], 0.0)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn, acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.linear.weight, self.linear.bias
        M, K = x.shape
        N = w.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=torch.float32)
        grid = (triton.cdiv(M, 64), triton.cdiv(N, 64))
        linear_relu_kernel[grid](x, w, b, y, M, N, K, x.stride(0), x.stride(1), w.stride(0),
                                 w.stride(1), y.stride(0), y.stride(1),
                                 BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
        return y
