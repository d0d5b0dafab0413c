# problem: rmsnorm
# device: any
# expect: reject
# pattern: C++ extension that can never compile (a CUDA-only intrinsic in host code) inside try/except, with a silent torch fallback
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

rmsnorm_source = r"""
#include <torch/extension.h>

torch::Tensor rmsnorm_forward(torch::Tensor x, torch::Tensor weight, double eps) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t cols = xc.size(-1);
    const int64_t rows = xc.numel() / cols;
    const float* xp = xc.data_ptr<float>();
    const float* wp = weight.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        float ss = 0.0f;
        for (int64_t j = 0; j < cols; ++j) ss += xp[r * cols + j] * xp[r * cols + j];
        const float inv = rsqrtf(ss / cols + (float)eps);
        for (int64_t j = 0; j < cols; ++j) yp[r * cols + j] = xp[r * cols + j] * inv * wp[j];
    }
    return y;
}
"""

try:
    rmsnorm_ext = load_inline(
        name="corpus_rmsnorm_never_builds",
        cpp_sources=rmsnorm_source,
        functions=["rmsnorm_forward"],
        extra_cflags=["-O3"],
        verbose=False,
    )
except Exception:
    rmsnorm_ext = None


class ModelNew(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if rmsnorm_ext is not None and not x.is_cuda:
            return rmsnorm_ext.rmsnorm_forward(x, self.weight, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight
