"""The bundled problems: stable names, KernelBench format, GPU-sized by default, small on request."""
from __future__ import annotations

import subprocess
import sys

from specgen.eval import load_candidate, load_problem
from tests.eval.conftest import BUNDLED

NAMES = ["fused_elementwise", "layernorm", "matmul_bias_relu", "softmax"]


def test_bundled_problem_names_are_stable() -> None:
    assert sorted(p.stem for p in BUNDLED.glob("*.py")) == NAMES
    for name in NAMES:
        problem = load_problem(BUNDLED / f"{name}.py")
        assert problem.name == name
        for kind in ("torch", "triton"):
            load_candidate(BUNDLED / "candidates" / f"{name}_{kind}.py", problem)


def test_scale_switch_shrinks_inputs() -> None:
    # One interpreter per scale; a problem reads SPECGEN_PROBLEM_SCALE when its module executes.
    script = ("import importlib.util, sys, torch\n"
              "for path in sys.argv[1:]:\n"
              "    spec = importlib.util.spec_from_file_location('p', path)\n"
              "    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
              "    print(sum(x.numel() for x in m.get_inputs()) if m.SMALL else m.batch_size)\n")
    paths = [str(BUNDLED / f"{name}.py") for name in NAMES]
    small = subprocess.run([sys.executable, "-c", script, *paths], capture_output=True,
                           text=True, env={"SPECGEN_PROBLEM_SCALE": "small"}, check=True)
    assert all(int(n) < 50_000 for n in small.stdout.split())  # CPU-sized inputs
    full = subprocess.run([sys.executable, "-c", script, *paths], capture_output=True, text=True,
                          env={}, check=True)
    # GPU-sized by default (only the constants are read: nothing that large is built here)
    assert [int(n) for n in full.stdout.split()] == [8192, 16, 4096, 4096]
