# problem: conv2d_bias_relu
# device: any
# expect: correct
# pattern: direct convolution in Triton: one program per (image, output channel, pixel block), boundary taps masked
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def conv2d_bias_relu_kernel(x_ptr, w_ptr, b_ptr, y_ptr, C, H, W, O,
                            KS: tl.constexpr, PAD: tl.constexpr, BLOCK: tl.constexpr):
    pid_no = tl.program_id(0)          # image * O + output channel
    pid_p = tl.program_id(1)           # block of output pixels
    img = pid_no // O
    oc = pid_no % O
    hw = H * W
    offs = pid_p * BLOCK + tl.arange(0, BLOCK)
    valid = offs < hw
    oh = offs // W
    ow = offs % W
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for c in range(0, C):
        x_base = x_ptr + (img * C + c).to(tl.int64) * hw
        w_base = w_ptr + (oc * C + c) * KS * KS
        for kh in tl.static_range(KS):
            ih = oh + kh - PAD
            row_ok = valid & (ih >= 0) & (ih < H)
            for kw in tl.static_range(KS):
                iw = ow + kw - PAD
                m = row_ok & (iw >= 0) & (iw < W)
                xv = tl.load(x_base + ih * W + iw, mask=m, other=0.0)
                wv = tl.load(w_base + kh * KS + kw)
                acc += xv * wv
    acc += tl.load(b_ptr + oc)
    acc = tl.maximum(acc, 0.0)
    tl.store(y_ptr + pid_no.to(tl.int64) * hw + offs, acc, mask=valid)


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n, c, h, w = x.shape
        o = self.conv.out_channels
        k = self.conv.kernel_size[0]
        pad = self.conv.padding[0]
        assert h + 2 * pad - k + 1 == h and w + 2 * pad - k + 1 == w, "odd kernel, same padding"
        y = torch.empty((n, o, h, w), device=x.device, dtype=x.dtype)
        BLOCK = 256
        grid = (n * o, triton.cdiv(h * w, BLOCK))
        conv2d_bias_relu_kernel[grid](x, self.conv.weight.detach(), self.conv.bias.detach(), y,
                                      c, h, w, o, KS=k, PAD=pad, BLOCK=BLOCK)
        return y
