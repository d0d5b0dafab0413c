# problem: mlp_gelu
# kind: wrong
# lang: triton
"""The GELU MLP in Triton with ReLU in the first layer's epilogue instead of GELU: right for
large positive pre-activations, wrong near zero and for negative ones."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def linear_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, ACT: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
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
    if ACT:
        acc = tl.maximum(acc, 0.0)
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def _linear(x, weight, bias, act):
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty((M, N), device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(M, 32), triton.cdiv(N, 64))
    linear_kernel[grid](x, weight, bias, y, M, N, K, ACT=act, BLOCK_M=32, BLOCK_N=64, BLOCK_K=32)
    return y


class ModelNew(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.fc2 = nn.Linear(hidden_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = _linear(x.contiguous(), self.fc1.weight.contiguous(), self.fc1.bias, True)
        return _linear(hidden, self.fc2.weight.contiguous(), self.fc2.bias, False)
