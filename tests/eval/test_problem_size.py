"""A GPU-sized problem is found before anything is allocated, and the refusal says how big it is,
that it is meant for a GPU, and how to run it small."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from specgen.eval.calls import ProblemModule  # noqa: E402
from specgen.eval.problem_size import cpu_refusal, measure, refusal_for  # noqa: E402
from specgen.messages import LoadProblem  # noqa: E402

# KernelBench-style: sizes written in, 8 GiB of inputs, no small scale.
HARD_CODED = '''
import torch
import torch.nn as nn

batch_size = 16
dim = 1 << 27


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''

SCALED = '''
import os
import torch
import torch.nn as nn

SMALL = os.environ.get("SPECGEN_PROBLEM_SCALE", "full") == "small"
n = 64 if SMALL else 32768


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))      # 4 GiB at full scale

    def forward(self, x):
        return x @ self.weight


def get_inputs():
    return [torch.randn(8, n)]


def get_init_inputs():
    return [n]
'''


def loaded(source: str, scale: str, tmp_path: Path) -> ProblemModule:
    return ProblemModule(LoadProblem(problem_source=source, problem_name="big", scale=scale,
                                     init_seed=1), "cpu", tmp_path)


def test_a_hard_coded_gpu_size_is_refused_at_once_with_its_sizes_to_shrink(tmp_path) -> None:
    began = time.monotonic()
    refusal = refusal_for(loaded(HARD_CODED, "small", tmp_path), "small")
    assert time.monotonic() - began < 5                  # measured on meta tensors
    assert refusal is not None
    assert refusal.startswith("problem big is sized for a GPU: one call's inputs are 8.0 GiB")
    assert "Run it on a GPU (--device cuda:0)" in refusal
    assert "set its sizes smaller (batch_size = 16, dim = 134217728)" in refusal
    assert "it has no small scale" in refusal


def test_a_problem_with_a_small_scale_is_told_to_use_it(tmp_path) -> None:
    refusal = refusal_for(loaded(SCALED, "full", tmp_path), "full")
    assert refusal is not None and "its parameters 4.0 GiB" in refusal
    assert "--scale small" in refusal
    assert refusal_for(loaded(SCALED, "small", tmp_path), "small") is None


def test_measure_counts_inputs_and_parameters_without_memory(tmp_path) -> None:
    problem = loaded(SCALED, "full", tmp_path)
    assert measure(problem.module, problem.init_inputs) == (8 * 32768 * 4, 32768 * 32768 * 4)


def test_below_the_limit_nothing_is_said() -> None:
    assert cpu_refusal("p", 1 << 20, 0, True, "small", {}) is None
    assert cpu_refusal("p", 3 << 30, 0, True, "small", {"n": 5}).endswith(
        "set its sizes smaller (n = 5): its small scale is still this large")
