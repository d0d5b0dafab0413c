# problem: cumsum
# device: cpu
# expect: correct
# pattern: C++-only load_inline scan over the last dimension, running sum kept in double
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cumsum_cpp_source = r"""
#include <torch/extension.h>

torch::Tensor cumsum_last(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "cumsum_last: CPU tensor expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "cumsum_last: float32 expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t cols = xc.size(-1);
    const int64_t rows = cols == 0 ? 0 : xc.numel() / cols;
    const float* xp = xc.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        double running = 0.0;
        for (int64_t j = 0; j < cols; ++j) {
            running += (double)xp[r * cols + j];
            yp[r * cols + j] = (float)running;
        }
    }
    return y;
}
"""

cumsum_ext = load_inline(
    name="corpus_cumsum_cpp",
    cpp_sources=cumsum_cpp_source,
    functions=["cumsum_last"],
    extra_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.dim() == 2, "the problem scans dimension 1 of a 2-D tensor"
        return cumsum_ext.cumsum_last(x)
