# problem: softmax
# device: cpu
# expect: correct
# pattern: C++ extension built inside try/except with a torch fallback; the build succeeds, so the fallback never runs
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

softmax_cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor softmax_rows(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "softmax_rows: CPU tensor expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "softmax_rows: float32 expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t cols = xc.size(-1);
    const int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
    const float* xp = xc.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = xp + r * cols;
        float* yr = yp + r * cols;
        float m = xr[0];
        for (int64_t j = 1; j < cols; ++j) {
            m = xr[j] > m ? xr[j] : m;
        }
        double total = 0.0;
        for (int64_t j = 0; j < cols; ++j) {
            const float e = std::exp(xr[j] - m);
            yr[j] = e;
            total += e;
        }
        const float inv = (float)(1.0 / total);
        for (int64_t j = 0; j < cols; ++j) {
            yr[j] *= inv;
        }
    }
    return y;
}
"""

try:
    softmax_ext = load_inline(
        name="corpus_softmax_cpp",
        cpp_sources=softmax_cpp_source,
        functions=["softmax_rows"],
        extra_cflags=["-O3"],
        verbose=False,
    )
except Exception:
    softmax_ext = None


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if softmax_ext is None:
            return torch.softmax(x, dim=-1)
        return softmax_ext.softmax_rows(x)
