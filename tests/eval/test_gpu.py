"""On a CUDA GPU: the honest Triton and load_inline candidates, the GPU-only hacks in `gpu/` (each
judged as its `# expect:` header says), isolation of illegal memory accesses, device asserts and
memory blow-ups, and how the judge's times relate to the device's. Skipped with a reason on
machines without a GPU."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from specgen.eval import EvalOptions, EvalWorker
from tests.eval.conftest import (BUNDLED, CORPUS, HERE, candidate_submission, header, submission,
                                 verdict_summary)
from tests.eval.expectations import meets

pytestmark = pytest.mark.gpu

GPU_CASES = HERE / "gpu"
CANDIDATES = BUNDLED / "candidates"
EXTENSION_SOURCES = [CANDIDATES / "fused_elementwise_cuda.py", GPU_CASES / "aten_only_extension.py",
                     GPU_CASES / "cuda_build_fails.py"]
CORPUS_GPU = sorted(p for p in (*(CORPUS / "honest").glob("*.py"), *(CORPUS / "cheat").glob("*.py"))
                    if header(p, "device") == "cuda")


def _cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # A shared cache (e.g. one a benchmark fills at the same time) can be named from outside.
    return os.environ.get("SPECGEN_TEST_EVAL_CACHE") or str(tmp_path_factory.mktemp("gpu-cache"))


@pytest.fixture(scope="module")
def gpu_worker(tmp_path_factory: pytest.TempPathFactory) -> EvalWorker:
    """KernelBench-sized problems (problem_scale "auto" is "full" on a GPU)."""
    worker = EvalWorker("cuda:0", tmp_path_factory.mktemp("gpu"), spare_processes=2,
                        options=EvalOptions(cache_dir=_cache_dir(tmp_path_factory),
                                            timeout_s=300))
    worker.start()
    # nvcc builds take a minute or more: start them now, in parallel on CPU threads, while the
    # tests before the extension tests use the GPU.
    builders = [threading.Thread(target=worker.build, args=(path.read_text(),), daemon=True)
                for path in EXTENSION_SOURCES]
    for thread in builders:
        thread.start()
    yield worker
    for thread in builders:
        thread.join(timeout=600)
    worker.close()


@pytest.fixture(scope="module")
def strict_gpu_worker(tmp_path_factory: pytest.TempPathFactory) -> EvalWorker:
    """Small problems, a 3 GB host-memory cap, for the isolation tests."""
    options = EvalOptions(problem_scale="small", memory_limit_mb=3000, timeout_s=120,
                          timing_trials=10, cache_dir=_cache_dir(tmp_path_factory))
    worker = EvalWorker("cuda:0", tmp_path_factory.mktemp("gpu-strict"), spare_processes=1,
                        options=options)
    worker.start()
    yield worker
    worker.close()


def run_case(worker: EvalWorker, path: Path, stage: str = "full"):
    return worker.run(submission(header(path, "problem"), path.read_text(), path.stem), stage)


def test_the_sandbox_starts_cuda(gpu_worker: EvalWorker) -> None:
    assert gpu_worker.sandbox_status.kind == "namespaces", gpu_worker.sandbox_status


@pytest.mark.parametrize("name", ["softmax_triton", "matmul_bias_relu_triton", "layernorm_triton",
                                  "fused_elementwise_triton", "softmax_torch"])
def test_honest_candidates_on_gpu(gpu_worker: EvalWorker, name: str) -> None:
    problem = name.rsplit("_", 1)[0]
    verdict = gpu_worker.run(submission(problem, (CANDIDATES / f"{name}.py").read_text(), name))
    assert verdict.correct and verdict.flags == [] and verdict.error is None, verdict
    assert verdict.device == "cuda:0" and not verdict.cpu_timing and verdict.sandbox == "namespaces"
    assert verdict.ref_ms > 0 and verdict.candidate_ms > 0 and verdict.floor_ms > 0
    assert verdict.candidate_ms >= verdict.floor_ms


@pytest.mark.parametrize("path", [p for p in sorted(GPU_CASES.glob("*.py"))
                                  if p not in EXTENSION_SOURCES], ids=lambda p: p.stem)
def test_gpu_hack_meets_its_expectation(strict_gpu_worker: EvalWorker, path: Path) -> None:
    verdict = run_case(strict_gpu_worker, path)
    ok, why = meets(verdict, header(path, "expect"))
    assert ok, f"{why}: {verdict_summary(verdict)}"


@pytest.mark.parametrize("path", CORPUS_GPU, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_corpus_gpu_candidate(gpu_worker: EvalWorker, path: Path) -> None:
    verdict = gpu_worker.run(candidate_submission(path), "full")
    ok, why = meets(verdict, header(path, "expect") or "correct")
    assert ok, f"{why}: {verdict_summary(verdict)}"


def test_a_fault_costs_one_candidate(strict_gpu_worker: EvalWorker) -> None:
    for case in ("illegal_access.py", "device_assert.py"):
        verdict = run_case(strict_gpu_worker, GPU_CASES / case)
        assert not verdict.correct and "(the reference" not in (verdict.error or ""), verdict
        after = strict_gpu_worker.run(submission("softmax", (CANDIDATES / "softmax_triton.py")
                                                 .read_text()))
        assert after.correct, after


def test_host_memory_is_limited_on_gpu_runners(strict_gpu_worker: EvalWorker) -> None:
    hog = ("import time, torch\nclass ModelNew(torch.nn.Module):\n"
           "    def forward(self, x):\n        keep = [torch.ones(250_000_000) for _ in range(8)]\n"
           "        time.sleep(60)\n        return x\n")
    verdict = strict_gpu_worker.run(submission("softmax", hog), "validate")
    assert "memory limit exceeded" in (verdict.error or ""), verdict
    assert "EvalOptions.memory_limit_mb" in verdict.error


def test_gpu_memory_is_capped(strict_gpu_worker: EvalWorker) -> None:
    hog = ("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
           "        return torch.empty(400 * 2**30, dtype=torch.uint8, device=x.device)\n")
    verdict = strict_gpu_worker.run(submission("softmax", hog), "validate")
    assert "out of memory" in (verdict.error or "").lower(), verdict


def test_layernorm_with_wrongly_shaped_parameters(gpu_worker: EvalWorker) -> None:
    verdict = run_case(gpu_worker, HERE / "redteam" / "layernorm_wrong_param_shape.py")
    assert "parameter-mismatch" in " ".join(verdict.flags) + (verdict.error or ""), verdict


def test_the_judges_time_is_the_devices_time(gpu_worker: EvalWorker) -> None:
    """A candidate that adds a known amount of device time (a spin kernel, timed here with CUDA
    events) to the reference's work is timed that much slower, within 10% of the added time: the
    judge's window (request sent to reply stamped, less the calls of nothing) tracks the GPU."""
    import torch

    cycles = 20_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)
    added = []
    for _ in range(5):
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        added.append(start.elapsed_time(end))
    added_ms = sorted(added)[2]
    source = (CANDIDATES / "softmax_torch.py").read_text()
    plain = gpu_worker.run(submission("softmax", source, "plain"), "full")
    assert plain.correct, plain
    # the same source with the spin added to its forward
    spin_source = source + (f"\n\n_forward = ModelNew.forward\n\n\ndef _spun(self, *args):\n"
                            f"    torch.cuda._sleep({cycles})\n    return _forward(self, *args)\n\n\n"
                            "ModelNew.forward = _spun\n")
    slowed = gpu_worker.run(submission("softmax", spin_source, "spun"), "full")
    assert slowed.correct, slowed
    extra = slowed.candidate_ms - plain.candidate_ms
    assert abs(extra - added_ms) <= 0.1 * added_ms, \
        (extra, added_ms, plain.candidate_ms, slowed.candidate_ms)


# --- extension tests last: their builds started when the worker fixture was created
def test_load_inline_candidate(gpu_worker: EvalWorker) -> None:
    source = (CANDIDATES / "fused_elementwise_cuda.py").read_text()
    verdict = gpu_worker.run(submission("fused_elementwise", source, "cuda"))
    assert verdict.correct and verdict.flags == [], verdict
    assert verdict.speedup > 0 and "build" in verdict.stage_seconds
    again = gpu_worker.run(submission("fused_elementwise", source, "cuda-again"), "profile")
    assert again.correct and again.stage_seconds["build"] == 0.0 and again.ref_cached


@pytest.mark.parametrize("path", [GPU_CASES / "cuda_build_fails.py",
                                  GPU_CASES / "aten_only_extension.py"], ids=lambda p: p.stem)
def test_extension_whose_kernel_never_runs_is_rejected(gpu_worker: EvalWorker, path: Path) -> None:
    verdict = run_case(gpu_worker, path)
    ok, why = meets(verdict, header(path, "expect"))
    assert ok, f"{why}: {verdict_summary(verdict)}"
