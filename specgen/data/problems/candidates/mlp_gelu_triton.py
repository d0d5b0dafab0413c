# problem: mlp_gelu
# kind: honest
# lang: triton
"""The GELU MLP in Triton: one tiled matmul kernel (fp32, IEEE precision) launched twice, the
first with bias + exact GELU fused into its epilogue, the second with bias only."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def linear_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, GELU: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x = tl.load(x_ptr + rm[:, None] * K + kk[None, :],
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + rn[None, :] * K + kk[:, None],
                    mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0)
        acc += tl.dot(x, w, input_precision="ieee")
    acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
    if GELU:
        acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, gelu: bool) -> torch.Tensor:
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty((M, N), device=x.device, dtype=torch.float32)
    block_m, block_n, block_k = (64, 64, 32) if x.is_cuda else (32, 128, 64)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    linear_kernel[grid](x, weight, bias, y, M, N, K, GELU=gelu, BLOCK_M=block_m, BLOCK_N=block_n,
                        BLOCK_K=block_k)
    return y


class ModelNew(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.fc2 = nn.Linear(hidden_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        hidden = _linear(x, self.fc1.weight.contiguous(), self.fc1.bias, True)
        return _linear(hidden, self.fc2.weight.contiguous(), self.fc2.bias, False)
