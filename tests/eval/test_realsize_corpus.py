"""The real-size corpus (tests/eval/realsize/), checked without a GPU: every candidate's headers,
that the loader accepts every file statically, that each problem is at KernelBench's size by
default and runs on the CPU at small scale (also at the second shape the judge probes), and that
the honest Triton candidates are right under TRITON_INTERPRET=1. The GPU verdicts are
tools/realsize_bench.py's."""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specgen.eval import FLAG_CODES, load_candidate, load_problem
from tests.eval.conftest import HERE
from tests.eval.expectations import header

REALSIZE = HERE / "realsize"
PROBLEMS = sorted((REALSIZE / "problems").glob("*.py"))
HONEST = sorted((REALSIZE / "honest").glob("*.py"))
CHEATS = sorted((REALSIZE / "cheat").glob("*.py"))
HEADER_KEYS = ("problem", "device", "expect", "pattern")

# KernelBench's published sizes, as the problems must have them when SPECGEN_PROBLEM_SCALE is
# not "small" (what the judge uses on a GPU).
FULL_SIZES = {
    "argmax": {"batch_size": 128, "dim1": 4096, "dim2": 4095, "reduce_dim": 1},
    "conv2d": {"batch_size": 16, "in_channels": 16, "out_channels": 128, "kernel_size": 3,
               "height": 1024, "width": 1024},
    "cross_entropy": {"batch_size": 32768, "num_classes": 4096},
    "cumsum": {"batch_size": 32768, "length": 32768, "scan_dim": 1},
    "gelu": {"batch_size": 4096, "dim": 393216},
    "matmul": {"M": 2048, "K": 8192, "N": 4096},
    "maxpool2d": {"batch_size": 32, "channels": 64, "height": 512, "width": 512,
                  "kernel_size": 4, "stride": 1, "padding": 1, "dilation": 1},
    "rmsnorm": {"batch_size": 112, "features": 64, "dim1": 512, "dim2": 512},
    "softmax": {"batch_size": 4096, "dim": 393216},
    "sum_dim": {"batch_size": 128, "dim1": 4096, "dim2": 4095, "reduce_dim": 1},
}


def headers(path: Path) -> dict[str, str]:
    """The four header lines, which must open the file in this order."""
    lines = path.read_text().splitlines()[:len(HEADER_KEYS)]
    found = {}
    for key, line in zip(HEADER_KEYS, lines):
        match = re.fullmatch(rf"# {key}: (\S.*)", line)
        assert match, f"{path.name}: line {len(found) + 1} should be '# {key}: ...', is {line!r}"
        found[key] = match.group(1).strip()
    assert len(found) == len(HEADER_KEYS), f"{path.name}: fewer than four header lines"
    return found


def valid_expectation(expect: str) -> bool:
    if expect in ("correct", "reject") or expect in FLAG_CODES:
        return True
    if expect.startswith("error:"):
        return bool(expect[len("error:"):].strip())
    if expect.startswith("honest-speed "):
        try:
            return float(expect.split()[1]) > 0
        except (IndexError, ValueError):
            return False
    return False


def test_the_corpus_is_complete() -> None:
    assert sorted(p.stem for p in PROBLEMS) == sorted(FULL_SIZES)
    readme = (REALSIZE / "README.md").read_text()
    for path in PROBLEMS + HONEST + CHEATS:
        assert f"`{path.stem}`" in readme, f"README.md does not describe {path.name}"
    problems_with_honest = {headers(p)["problem"] for p in HONEST}
    assert problems_with_honest == set(FULL_SIZES), "every problem needs an honest candidate"
    texts = {p.stem: p.read_text() for p in HONEST}
    assert sum("import triton" in t for t in texts.values()) >= 3
    assert sum("load_inline" in t for t in texts.values()) >= 3
    # A build-ahead judge must meet extensions built at import, in __init__ and in forward.
    built_at = {stem: where_built(text) for stem, text in texts.items() if "load_inline(" in text}
    assert list(built_at.values()).count("forward") >= 2, built_at
    assert {"import", "__init__"} <= set(built_at.values()), built_at
    assert len(CHEATS) >= 8


def where_built(text: str) -> str:
    """Where a candidate calls load_inline: "import" (module level), "__init__" or "forward"
    (a method of ModelNew, or a module-level helper that method calls)."""
    tree = ast.parse(text)

    def calls(node: ast.AST, name: str) -> bool:
        return any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", ""))
                   == name for n in ast.walk(node))

    helpers = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)
               and calls(n, "load_inline")}
    if any(calls(n, "load_inline") for n in tree.body
           if not isinstance(n, (ast.FunctionDef, ast.ClassDef))):
        return "import"
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"):
        for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            if calls(method, "load_inline") or any(calls(method, h) for h in helpers):
                return method.name
    return "none"


@pytest.mark.parametrize("path", HONEST + CHEATS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_candidate_headers_and_static_load(path: Path) -> None:
    found = headers(path)
    # What the bench and the other tests read (tests/eval/expectations.py) is the same.
    assert all(header(path, key) == value for key, value in found.items())
    assert found["device"] == "cuda", "real-size candidates run on a GPU only"
    assert valid_expectation(found["expect"]), f"unknown expectation {found['expect']!r}"
    if path.parent.name == "honest":
        assert found["expect"] == "correct"
    else:
        assert found["expect"] != "correct", "a cheat must expect something other than correct"
    problem_path = REALSIZE / "problems" / f"{found['problem']}.py"
    assert problem_path.is_file(), f"no problem {found['problem']} for {path.name}"
    assert len(found["pattern"]) > 20, "the pattern line should say what the file does"
    problem = load_problem(problem_path)
    candidate = load_candidate(path, problem)     # ModelNew's signature against Model's
    if path.parent.name == "honest":
        assert candidate.claims_custom_kernels, "honest candidates here run kernels of their own"


@pytest.mark.parametrize("path", PROBLEMS, ids=lambda p: p.stem)
def test_problem_is_at_kernelbench_size(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    load_problem(path)
    monkeypatch.delenv("SPECGEN_PROBLEM_SCALE", raising=False)
    spec = importlib.util.spec_from_file_location(f"realsize_full_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)            # constants only: no tensor is made at import
    assert not module.SMALL
    assert {k: getattr(module, k) for k in FULL_SIZES[path.stem]} == FULL_SIZES[path.stem]


@pytest.mark.parametrize("path", PROBLEMS, ids=lambda p: p.stem)
def test_problem_runs_small_on_the_cpu(path: Path, monkeypatch: pytest.MonkeyPatch,
                                       tmp_path: Path) -> None:
    import torch

    from specgen.eval.calls import ProblemModule, flatten
    from specgen.messages import LoadProblem

    # ProblemModule sets the variable for the process, as in a runner: put back afterwards.
    monkeypatch.setenv("SPECGEN_PROBLEM_SCALE", "small")
    problem = ProblemModule(LoadProblem(problem_source=path.read_text(), problem_name=path.stem,
                                        scale="small", init_seed=1234), "cpu", tmp_path)
    shape = problem.shape_constants()
    assert shape, "no module-level size read by get_inputs(): the second-shape probe has none"
    model = problem.build(problem.module.Model)
    for sizes in ({}, {name: max(1, value * 3 // 4) for name, value in shape.items()}):
        inputs = problem.inputs(7, sizes)
        assert sum(x.numel() for x in inputs if isinstance(x, torch.Tensor)) < 50_000
        with torch.no_grad():
            out = flatten(model(*inputs))
        assert out and all(isinstance(t, torch.Tensor) for t in out)
        assert all(torch.isfinite(t.double()).all() for t in out if t.is_floating_point())


TRITON_SCRIPT = r"""
import json, sys, tempfile
from pathlib import Path
import torch
from specgen.eval.calls import ProblemModule, flatten
from specgen.eval.compare import AccurateModel, compare_outputs
from specgen.eval.loader import candidate_from_text, exec_source
from specgen.messages import LoadProblem

results = {}
for name in sys.argv[2:]:
    path = Path(name)
    problem_name = path.read_text().splitlines()[0].split(":", 1)[1].strip()
    source = (Path(sys.argv[1]) / f"{problem_name}.py").read_text()
    work = Path(tempfile.mkdtemp())
    try:
        problem = ProblemModule(LoadProblem(problem_source=source, problem_name=problem_name,
                                            scale="small", init_seed=99), "cpu", work)
        candidate = exec_source(candidate_from_text(path.read_text()), "cand_" + path.stem, work)
        reference = problem.build(problem.module.Model)
        accurate = AccurateModel(reference)
        new = problem.build(candidate.ModelNew)
        shape = problem.shape_constants()
        failures = []
        for seed, sizes in ((1, {}), (2, {k: max(1, v * 3 // 4) for k, v in shape.items()})):
            inputs = problem.inputs(seed, sizes)
            with torch.no_grad():
                got = flatten(new(*[x.clone() for x in inputs]))
                ref = flatten(reference(*[x.clone() for x in inputs]))
            acc = accurate.outputs([x.clone() for x in inputs])
            result = compare_outputs(got, ref, acc)
            if not result.ok:
                failures.append(f"seed {seed} sizes {sizes}: {result.reason}")
        results[path.stem] = failures
    except Exception as exc:
        results[path.stem] = [f"{type(exc).__name__}: {exc}"]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def triton_results() -> dict[str, list[str]]:
    paths = [p for p in HONEST if "import triton" in p.read_text()]
    env = {**os.environ, "TRITON_INTERPRET": "1", "SPECGEN_PROBLEM_SCALE": "small",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", TRITON_SCRIPT, str(REALSIZE / "problems"),
                           *map(str, paths)], capture_output=True, text=True, env=env,
                          timeout=600, cwd=HERE.parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("path", [p for p in HONEST if "import triton" in p.read_text()],
                         ids=lambda p: p.stem)
def test_triton_candidate_is_right_under_the_interpreter(path: Path,
                                                         triton_results: dict) -> None:
    assert path.stem in triton_results
    assert triton_results[path.stem] == [], triton_results[path.stem]
