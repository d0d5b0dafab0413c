# problem: maxpool2d
# device: cuda
# expect: correct
# pattern: Triton 2-D max pooling: one program per (plane, output row, column block), the window unrolled at compile time, padding read as -inf through masked loads
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def maxpool2d_kernel(x_ptr, y_ptr, H, W, HO, WO, KS: tl.constexpr, STRIDE: tl.constexpr,
                     PAD: tl.constexpr, DIL: tl.constexpr, BLOCK_W: tl.constexpr):
    pid_w = tl.program_id(0)
    oh = tl.program_id(1)
    plane = tl.program_id(2).to(tl.int64)
    ow = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    out_mask = ow < WO
    x_plane = x_ptr + plane * H * W
    best = tl.full([BLOCK_W], -float("inf"), tl.float32)
    for kh in tl.static_range(KS):
        ih = oh * STRIDE - PAD + kh * DIL
        row_ok = (ih >= 0) & (ih < H)
        for kw in tl.static_range(KS):
            iw = ow * STRIDE - PAD + kw * DIL
            ok = out_mask & row_ok & (iw >= 0) & (iw < W)
            v = tl.load(x_plane + ih * W + iw, mask=ok, other=-float("inf"))
            best = tl.maximum(best, v)
    tl.store(y_ptr + plane * HO * WO + oh * WO + ow, best, mask=out_mask)


class ModelNew(nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int, dilation: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.dilation = dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n, c, h, w = x.shape
        k, s, p, d = self.kernel_size, self.stride, self.padding, self.dilation
        ho = (h + 2 * p - d * (k - 1) - 1) // s + 1
        wo = (w + 2 * p - d * (k - 1) - 1) // s + 1
        y = torch.empty((n, c, ho, wo), dtype=x.dtype, device=x.device)
        if y.numel() == 0:
            return y
        block_w = min(512, triton.next_power_of_2(wo))
        grid = (triton.cdiv(wo, block_w), ho, n * c)
        maxpool2d_kernel[grid](x, y, h, w, ho, wo, KS=k, STRIDE=s, PAD=p, DIL=d,
                               BLOCK_W=block_w, num_warps=4)
        return y
