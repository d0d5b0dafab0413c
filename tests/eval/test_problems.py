"""The bundled problems: stable names, KernelBench format, GPU-sized by default, small on request."""
from __future__ import annotations

import subprocess
import sys

from specgen.eval import load_candidate, load_problem
from tests.eval.conftest import BUNDLED

NAMES = ["attention", "conv2d_bias_relu", "fused_elementwise", "layernorm", "matmul_bias_relu",
         "mlp_gelu", "softmax", "sum_reduction"]


def test_bundled_problem_names_are_stable() -> None:
    assert sorted(p.stem for p in BUNDLED.glob("*.py")) == NAMES
    for name in NAMES:
        problem = load_problem(BUNDLED / f"{name}.py")
        assert problem.name == name
        for lang in ("torch", "triton", "cuda", "cpp"):
            load_candidate(BUNDLED / "candidates" / f"{name}_{lang}.py", problem)


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
    assert [int(n) for n in full.stdout.split()] == [16, 32, 8192, 16, 4096, 2048, 4096, 256]


def test_small_references_run_fast_on_the_cpu() -> None:
    # The CPU-sized instance must keep a reference call well under ~50 ms on a small machine (one
    # intra-op thread, as the CPU runners use): median of a few calls after a warm-up.
    script = ("import importlib.util, statistics, sys, time, torch\n"
              "torch.set_num_threads(1)\n"
              "for path in sys.argv[1:]:\n"
              "    spec = importlib.util.spec_from_file_location('p', path)\n"
              "    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
              "    model = m.Model(*m.get_init_inputs()); inputs = m.get_inputs()\n"
              "    samples = []\n"
              "    with torch.no_grad():\n"
              "        for _ in range(6):\n"
              "            began = time.perf_counter(); model(*inputs)\n"
              "            samples.append((time.perf_counter() - began) * 1e3)\n"
              "    print(statistics.median(samples[1:]))\n")
    paths = [str(BUNDLED / f"{name}.py") for name in NAMES]
    run = subprocess.run([sys.executable, "-c", script, *paths], capture_output=True, text=True,
                         env={"SPECGEN_PROBLEM_SCALE": "small", "OMP_NUM_THREADS": "1"},
                         check=True)
    times = dict(zip(NAMES, (float(t) for t in run.stdout.split())))
    assert len(times) == len(NAMES) and all(ms < 25.0 for ms in times.values()), times
