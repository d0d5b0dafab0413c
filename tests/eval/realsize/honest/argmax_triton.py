# problem: argmax
# device: cuda
# expect: correct
# pattern: Triton argmax over a middle dimension: each program scans a block of inner columns down the reduced dimension in row chunks; leftmost index within a chunk and a strict '>' between chunks keep the first maximum on ties
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def argmax_middle_kernel(x_ptr, out_ptr, reduced, inner, BLOCK_R: tl.constexpr,
                         BLOCK_C: tl.constexpr):
    pid_c = tl.program_id(0)
    outer = tl.program_id(1).to(tl.int64)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < inner
    base = outer * reduced * inner
    r_offs = tl.arange(0, BLOCK_R)
    best = tl.full([BLOCK_C], -float("inf"), tl.float32)
    best_idx = tl.zeros([BLOCK_C], tl.int64)
    for r0 in range(0, reduced, BLOCK_R):
        rows = r0 + r_offs
        mask = (rows[:, None] < reduced) & col_mask[None, :]
        ptrs = x_ptr + base + rows[:, None].to(tl.int64) * inner + cols[None, :]
        tile = tl.load(ptrs, mask=mask, other=-float("inf"))
        chunk_max, chunk_idx = tl.max(tile, axis=0, return_indices=True,
                                      return_indices_tie_break_left=True)
        # Strictly greater: an equal maximum in a later chunk keeps the earlier index.
        take = chunk_max > best
        best = tl.where(take, chunk_max, best)
        best_idx = tl.where(take, r0 + chunk_idx.to(tl.int64), best_idx)
    tl.store(out_ptr + outer * inner + cols, best_idx, mask=col_mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        dim = self.dim % x.dim()
        outer = 1
        for size in x.shape[:dim]:
            outer *= size
        inner = 1
        for size in x.shape[dim + 1:]:
            inner *= size
        reduced = x.shape[dim]
        out_shape = x.shape[:dim] + x.shape[dim + 1:]
        out = torch.empty(out_shape, dtype=torch.int64, device=x.device)
        if out.numel() == 0:
            return out
        block_c = 128
        grid = (triton.cdiv(inner, block_c), outer)
        argmax_middle_kernel[grid](x, out, reduced, inner, BLOCK_R=32, BLOCK_C=block_c,
                                   num_warps=4)
        return out
