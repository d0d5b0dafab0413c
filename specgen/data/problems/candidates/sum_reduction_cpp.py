# problem: sum_reduction
# kind: honest
# lang: cpp
"""Sum over one dimension, kept, as a C++ CPU kernel through load_inline: the tensor is viewed as
(outer, reduced, inner); each output row accumulates the reduced rows with SIMD adds along the
contiguous inner axis (one pass over the input, the accumulator in the output itself), or one SIMD
reduction when the reduced axis is the contiguous one; OpenMP over outer rows."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cstdint>
#include <vector>

torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() >= 1,
                "float32 CPU input");
    if (dim < 0) dim += x.dim();
    TORCH_CHECK(dim >= 0 && dim < x.dim(), "dim out of range");
    x = x.contiguous();
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
    const int64_t reduced = x.size(dim);
    std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
    sizes[dim] = 1;
    auto y = torch::empty(sizes, x.options());
    const float* __restrict xp = x.data_ptr<float>();
    float* __restrict yp = y.data_ptr<float>();
    if (inner == 1) {
#pragma omp parallel for schedule(static)
        for (int64_t o = 0; o < outer; ++o) {
            const float* __restrict in = xp + o * reduced;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int64_t r = 0; r < reduced; ++r) s += in[r];
            yp[o] = s;
        }
        return y;
    }
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
        const float* __restrict in = xp + o * reduced * inner;
        float* __restrict acc = yp + o * inner;
        if (reduced == 0) {
            for (int64_t i = 0; i < inner; ++i) acc[i] = 0.0f;
            continue;
        }
#pragma omp simd
        for (int64_t i = 0; i < inner; ++i) acc[i] = in[i];
        for (int64_t r = 1; r < reduced; ++r) {
            const float* __restrict row = in + r * inner;
#pragma omp simd
            for (int64_t i = 0; i < inner; ++i) acc[i] += row[i];
        }
    }
    return y;
}
"""

_ext = load_inline(name="sum_reduction_cpp_ext", cpp_sources=cpp_source,
                   functions=["sum_dim_forward"],
                   extra_cflags=["-O3", "-fopenmp", "-march=native"],
                   extra_ldflags=["-fopenmp"], verbose=False)
sum_dim_forward = _ext.sum_dim_forward  # looked up once, not on every call


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum_dim_forward(x, self.dim)
