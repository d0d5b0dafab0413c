# problem: argmax
# device: cpu
# expect: correct
# pattern: C++-only load_inline argmax returning an int64 tensor, first index kept on ties
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

argmax_cpp_source = r"""
#include <torch/extension.h>

torch::Tensor argmax_rows(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "argmax_rows: CPU tensor expected");
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "2-D float32 expected");
    auto xc = x.contiguous();
    const int64_t rows = xc.size(0);
    const int64_t cols = xc.size(1);
    TORCH_CHECK(cols > 0, "argmax_rows: empty rows");
    auto out = torch::empty({rows}, xc.options().dtype(torch::kLong));
    const float* xp = xc.data_ptr<float>();
    int64_t* op = out.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = xp + r * cols;
        int64_t best = 0;
        for (int64_t j = 1; j < cols; ++j) {
            if (xr[j] > xr[best]) {
                best = j;
            }
        }
        op[r] = best;
    }
    return out;
}
"""

argmax_ext = load_inline(
    name="corpus_argmax_cpp",
    cpp_sources=argmax_cpp_source,
    functions=["argmax_rows"],
    extra_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return argmax_ext.argmax_rows(x)
