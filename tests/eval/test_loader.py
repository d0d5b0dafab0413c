"""Loading problems and candidates: file or string, static checks, separate namespaces."""
from __future__ import annotations

from pathlib import Path

import pytest

from specgen.errors import UsageError
from specgen.eval import load_candidate, load_problem
from specgen.eval.loader import exec_source
from tests.eval.conftest import BUNDLED

SOFTMAX = BUNDLED / "softmax.py"
GOOD = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def test_problem_from_file_and_from_string_hash_alike() -> None:
    from_file = load_problem(SOFTMAX)
    from_text = load_problem(SOFTMAX.read_text())
    assert from_file.name == "softmax" and from_file.origin == str(SOFTMAX)
    assert from_text.origin == "<string>" and from_text.sha256 == from_file.sha256
    assert load_problem(str(SOFTMAX)).sha256 == from_file.sha256


@pytest.mark.parametrize("source, message", [
    ("import torch\ndef get_inputs():\n    return []\n", "missing Model, get_init_inputs"),
    ("class Model:\n    def forward(self, x) return x\n", "syntax error at line 2"),
    ("", "source is empty"),
])
def test_bad_problem_names_what_to_fix(source: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load_problem(source if source else "")


def test_missing_files_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="problem file not found"):
        load_problem(tmp_path / "nope.py")
    with pytest.raises(UsageError, match="candidate file not found"):
        load_candidate(str(tmp_path / "nope.py"))


def test_candidate_without_model_new_is_rejected() -> None:
    with pytest.raises(UsageError, match="no ModelNew defined"):
        load_candidate("import torch\nclass Model(torch.nn.Module):\n    pass\n")


def test_candidate_syntax_error_gives_line() -> None:
    with pytest.raises(UsageError, match="candidate <string>: syntax error at line 3"):
        load_candidate("import torch\nclass ModelNew:\n    def forward(self x):\n        pass\n")


def test_signature_must_match_the_problem() -> None:
    problem = load_problem(BUNDLED / "fused_elementwise.py")  # forward(x, y), __init__(dim)
    one_input = ("import torch\nclass ModelNew(torch.nn.Module):\n    def __init__(self, dim):\n"
                 "        super().__init__()\n    def forward(self, x):\n        return x\n")
    with pytest.raises(UsageError, match=r"ModelNew.forward takes 1 argument but Model.forward "
                                         r"takes 2 arguments"):
        load_candidate(one_input, problem)
    no_init_args = ("import torch\nclass ModelNew(torch.nn.Module):\n    def __init__(self):\n"
                    "        super().__init__()\n    def forward(self, x, y):\n        return x\n")
    with pytest.raises(UsageError, match=r"ModelNew.__init__ takes 0 arguments"):
        load_candidate(no_init_args, problem)
    flexible = ("import torch\nclass ModelNew(torch.nn.Module):\n    def __init__(self, *a):\n"
                "        super().__init__()\n    def forward(self, *inputs):\n        return 0\n")
    assert load_candidate(flexible, problem).text == flexible


def test_kernel_kinds_are_detected() -> None:
    candidates = BUNDLED / "candidates"
    assert load_candidate(candidates / "softmax_triton.py").kernel_kinds == ("triton",)
    assert load_candidate(candidates / "softmax_torch.py").kernel_kinds == ()
    ext = load_candidate("from torch.utils.cpp_extension import load_inline\nModelNew = None\n")
    assert ext.needs_build and ext.claims_custom_kernels


def test_modules_get_separate_namespaces(tmp_path: Path) -> None:
    problem = load_problem(SOFTMAX)
    candidate = load_candidate("batch_size = 2\ndim = 8\nModelNew = object\n")
    problem_module = exec_source(problem, "specgen_problem_test_ns", tmp_path)
    candidate_module = exec_source(candidate, "specgen_candidate_test_ns", tmp_path)
    assert candidate_module.batch_size == 2
    assert problem_module.batch_size == 4096 and problem_module.dim == 65536
    assert (tmp_path / "specgen_problem_test_ns.py").read_text() == problem.text
