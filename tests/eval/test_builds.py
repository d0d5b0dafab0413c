"""A worker's builds: every load_inline call of a candidate is built before its run (at import, in
its constructor, in its first forward), once per source, problem and scale; a run compiles
nothing and says so for a call no build could make; a failed build's verdict carries the
compiler's words."""
from __future__ import annotations

import pytest

from specgen.eval import EvalWorker
from specgen.eval.builds import marker_name
from specgen.eval.loader import candidate_from_text, problem_from_text
from tests.eval.conftest import BUNDLED, submission

PROBLEM = (BUNDLED / "fused_elementwise.py").read_text()

KERNEL = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor fused_forward(torch::Tensor x, torch::Tensor y, torch::Tensor bias) {
    x = x.contiguous();
    y = y.contiguous();
    bias = bias.contiguous();
    auto out = torch::empty_like(x);
    const int64_t dim = bias.numel(), n = x.numel();
    const float* xp = x.data_ptr<float>();
    const float* yp = y.data_ptr<float>();
    const float* bp = bias.data_ptr<float>();
    float* op = out.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
        const float h = xp[i] + bp[i % dim];
        op[i] = 0.5f * h * (1.0f + std::erf(h * 0.70710678f)) / (1.0f + std::exp(-yp[i]));
    }
    return out;
}
"""

# gelu(x + bias) * sigmoid(y) in C++, its extension built in ModelNew's constructor (as most
# public candidates do), under the name NAME.
IN_CONSTRUCTOR = f"""import uuid

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

KERNEL = {KERNEL!r}


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)
        self.ext = load_inline(name=NAME, cpp_sources=KERNEL, functions=["fused_forward"],
                               extra_cflags=["-O2"], verbose=True)

    def forward(self, x, y):
        return self.ext.fused_forward(x, y, self.bias)
"""


def test_markers_differ_by_problem_and_scale() -> None:
    candidate = candidate_from_text("import torch\nclass ModelNew(torch.nn.Module):\n    pass\n")
    problem = problem_from_text(PROBLEM)
    names = {marker_name(candidate, None, "small"), marker_name(candidate, problem, "small"),
             marker_name(candidate, problem, "full")}
    assert len(names) == 3 and marker_name(candidate, None, "full") == candidate.sha256


def test_a_build_in_the_constructor_is_made_ahead_and_the_run_compiles_nothing(
        cpu_worker: EvalWorker) -> None:
    sub = submission("fused_elementwise", IN_CONSTRUCTOR.replace("NAME", '"fused_in_init"'))
    built = cpu_worker.build(sub)
    assert [r.ok for r in built.records] == [True] and not built.module_error, built
    assert built.records[0].name == "fused_in_init"
    verdict = cpu_worker.run(sub, "validate")
    # A run refuses a call no build made: a correct verdict means it loaded the build's.
    assert verdict.correct and not verdict.flags, verdict
    assert verdict.stage_seconds["build"] == 0.0                  # the marker, not a build


def test_a_call_whose_name_only_a_run_knows_is_refused_there(cpu_worker: EvalWorker) -> None:
    source = IN_CONSTRUCTOR.replace("NAME", '"fused_" + uuid.uuid4().hex[:8]')
    verdict = cpu_worker.run(submission("fused_elementwise", source), "validate")
    assert not verdict.correct
    assert "was not built ahead: the runner compiles nothing" in verdict.error, verdict.error


def test_a_failed_build_says_what_the_compiler_said(cpu_worker: EvalWorker) -> None:
    broken = IN_CONSTRUCTOR.replace("NAME", '"fused_broken"').replace("return out;", "return out")
    verdict = cpu_worker.run(submission("fused_elementwise", broken), "validate")
    error = verdict.error.replace("\u2018", "'").replace("\u2019", "'")
    assert not verdict.correct and "error: expected ';'" in error, verdict.error
    assert "-isystem" not in error and "[1/2]" not in error
