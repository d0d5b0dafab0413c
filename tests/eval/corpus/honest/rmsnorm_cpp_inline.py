# problem: rmsnorm
# device: cpu
# expect: correct
# pattern: C++-only load_inline extension (CPU), sum of squares accumulated in double
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

rmsnorm_cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor rmsnorm_forward(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.device().is_cpu(), "rmsnorm_forward: CPU tensor expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "rmsnorm_forward: float32 expected");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    const int64_t cols = xc.size(-1);
    TORCH_CHECK(wc.numel() == cols, "rmsnorm_forward: weight size mismatch");
    auto y = torch::empty_like(xc);
    const int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
    const float* xp = xc.data_ptr<float>();
    const float* wp = wc.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = xp + r * cols;
        float* yr = yp + r * cols;
        double ss = 0.0;
        for (int64_t j = 0; j < cols; ++j) {
            ss += (double)xr[j] * (double)xr[j];
        }
        const double inv = 1.0 / std::sqrt(ss / (double)cols + eps);
        for (int64_t j = 0; j < cols; ++j) {
            yr[j] = (float)((double)xr[j] * inv * (double)wp[j]);
        }
    }
    return y;
}
"""

rmsnorm_ext = load_inline(
    name="corpus_rmsnorm_cpp",
    cpp_sources=rmsnorm_cpp_source,
    functions=["rmsnorm_forward"],
    extra_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rmsnorm_ext.rmsnorm_forward(x, self.weight.detach(), self.eps)
