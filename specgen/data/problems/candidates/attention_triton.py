# problem: attention
# kind: honest
# lang: triton
"""Attention in Triton, flash-attention style: each program owns a block of queries of one
(batch, head), streams the keys and values in blocks with an online softmax (running max and sum
rescaling the accumulator), fp32 dots at IEEE precision; the score matrix never leaves registers."""
import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, S, D, scale,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh * S * D
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    d_ok = dims < D
    q = tl.load(q_ptr + base + rows[:, None] * D + dims[None, :],
                mask=(rows[:, None] < S) & d_ok[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(0, S, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        kv_mask = (cols[:, None] < S) & d_ok[None, :]
        k = tl.load(k_ptr + base + cols[:, None] * D + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + base + cols[:, None] * D + dims[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        s = tl.where(cols[None, :] < S, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + base + rows[:, None] * D + dims[None, :], out,
             mask=(rows[:, None] < S) & d_ok[None, :])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        B, H, S, D = q.shape
        out = torch.empty_like(q)
        block = 64 if q.is_cuda else 32
        block_d = max(16, triton.next_power_of_2(D))
        grid = (triton.cdiv(S, block), B * H)
        attention_kernel[grid](q, k, v, out, S, D, 1.0 / math.sqrt(D), BLOCK_M=block,
                               BLOCK_N=block, BLOCK_D=block_d)
        return out
