# problem: rmsnorm
# device: cuda
# expect: correct
# pattern: Triton RMSNorm over dimension 1 of (B, F, H, W): each program takes a block of contiguous spatial positions of one batch item and reduces over the features, F-strided, so every load is coalesced along H*W
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def rmsnorm_dim1_kernel(x_ptr, y_ptr, n_features, spatial, eps,
                        BLOCK_F: tl.constexpr, BLOCK_S: tl.constexpr):
    pid_s = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    s_offs = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    s_mask = s_offs < spatial
    base = batch * n_features * spatial
    f_offs = tl.arange(0, BLOCK_F)
    squares = tl.zeros([BLOCK_S], tl.float32)
    for f0 in range(0, n_features, BLOCK_F):
        f = f0 + f_offs
        mask = (f[:, None] < n_features) & s_mask[None, :]
        ptrs = x_ptr + base + f[:, None].to(tl.int64) * spatial + s_offs[None, :]
        v = tl.load(ptrs, mask=mask, other=0.0)
        squares += tl.sum(v * v, axis=0)
    # Correctly rounded square root and division, as torch.sqrt and the division in the reference.
    rms = tl.sqrt_rn(squares / n_features + eps)
    for f0 in range(0, n_features, BLOCK_F):
        f = f0 + f_offs
        mask = (f[:, None] < n_features) & s_mask[None, :]
        offsets = base + f[:, None].to(tl.int64) * spatial + s_offs[None, :]
        v = tl.load(x_ptr + offsets, mask=mask, other=0.0)
        tl.store(y_ptr + offsets, tl.div_rn(v, rms[None, :]), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        batch, n_features = x.shape[0], x.shape[1]
        spatial = x.numel() // (batch * n_features) if batch * n_features else 0
        y = torch.empty_like(x)
        if y.numel() == 0:
            return y
        block_f = min(64, triton.next_power_of_2(n_features))
        block_s = 128
        grid = (triton.cdiv(spatial, block_s), batch)
        rmsnorm_dim1_kernel[grid](x, y, n_features, spatial, self.eps,
                                  BLOCK_F=block_f, BLOCK_S=block_s, num_warps=8)
        return y
