"""On a CUDA GPU: Triton and load_inline candidates, GPU-only cheats (side streams, extensions that
never run their own kernel, speedups past the physical floor), and isolation of illegal memory
accesses, device asserts and memory blow-ups. Skipped with a reason on machines without a GPU."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from specgen.eval import EvalOptions, EvalWorker
from tests.eval.conftest import BUNDLED, HERE, codes, header, submission

pytestmark = pytest.mark.gpu

GPU_CASES = HERE / "gpu"
CANDIDATES = BUNDLED / "candidates"
EXTENSION_SOURCES = [CANDIDATES / "fused_elementwise_cuda.py", GPU_CASES / "aten_only_extension.py"]


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


@pytest.mark.parametrize("name", ["softmax_triton", "matmul_bias_relu_triton", "layernorm_triton",
                                  "fused_elementwise_triton", "softmax_torch"])
def test_honest_candidates_on_gpu(gpu_worker: EvalWorker, name: str) -> None:
    problem = name.rsplit("_", 1)[0]
    verdict = gpu_worker.run(submission(problem, (CANDIDATES / f"{name}.py").read_text(), name))
    assert verdict.correct and verdict.flags == [] and verdict.error is None, verdict
    assert verdict.device == "cuda:0" and not verdict.cpu_timing
    assert verdict.ref_ms > 0 and verdict.candidate_ms > 0 and verdict.floor_ms > 0
    assert verdict.candidate_ms >= verdict.floor_ms


def test_illegal_memory_access_costs_one_candidate(strict_gpu_worker: EvalWorker) -> None:
    verdict = run_case(strict_gpu_worker, GPU_CASES / "illegal_access.py")
    assert not verdict.correct and "illegal memory access" in verdict.error.lower(), verdict
    after = strict_gpu_worker.run(submission("softmax", (CANDIDATES / "softmax_triton.py")
                                             .read_text()))
    assert after.correct, after


def test_poisoned_context_costs_one_candidate(strict_gpu_worker: EvalWorker) -> None:
    verdict = run_case(strict_gpu_worker, GPU_CASES / "device_assert.py")
    assert not verdict.correct and "device-side assert" in verdict.error, verdict
    after = strict_gpu_worker.run(submission("softmax", (CANDIDATES / "softmax_torch.py")
                                             .read_text()))
    assert after.correct, after


def test_host_memory_is_watched_on_gpu_runners(strict_gpu_worker: EvalWorker) -> None:
    hog = ("import time, torch\nclass ModelNew(torch.nn.Module):\n"
           "    def forward(self, x):\n        keep = [torch.ones(250_000_000) for _ in range(8)]\n"
           "        time.sleep(60)\n        return x\n")
    verdict = strict_gpu_worker.run(submission("softmax", hog), "validate")
    assert verdict.error.startswith("candidate memory limit exceeded"), verdict
    assert "EvalOptions.memory_limit_mb" in verdict.error


def test_gpu_memory_is_capped(strict_gpu_worker: EvalWorker) -> None:
    hog = ("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
           "        return torch.empty(400 * 2**30, dtype=torch.uint8, device=x.device)\n")
    verdict = strict_gpu_worker.run(submission("softmax", hog), "validate")
    assert "out of memory" in verdict.error.lower() and "gpu_memory_fraction" in verdict.error


def test_side_stream_exploit_is_rejected(gpu_worker: EvalWorker) -> None:
    hidden = run_case(gpu_worker, GPU_CASES / "side_stream_hidden.py")
    assert "side-stream" in codes(hidden) and not hidden.correct, hidden
    assert "kernels ran on stream" in hidden.flags[0]  # seen by the profiler, not the scan
    plain = run_case(gpu_worker, HERE / "redteam" / "side_stream_static.py")
    assert "side-stream" in codes(plain) and not plain.correct


def test_speedup_past_the_physical_floor_is_flagged(gpu_worker: EvalWorker) -> None:
    verdict = run_case(gpu_worker, GPU_CASES / "memo_beyond_floor.py")
    assert codes(verdict) == ["beyond-floor"], verdict
    assert verdict.candidate_ms < verdict.floor_ms


def test_layernorm_with_wrongly_shaped_parameters(gpu_worker: EvalWorker) -> None:
    verdict = run_case(gpu_worker, HERE / "redteam" / "layernorm_wrong_param_shape.py")
    assert "parameter-mismatch" in codes(verdict) and "(64, 256, 256)" in verdict.flags[0]


def test_candidate_constants_do_not_change_the_problem(gpu_worker: EvalWorker) -> None:
    verdict = run_case(gpu_worker, HERE / "redteam" / "module_constants_shadow.py", "validate")
    assert not verdict.correct and "shape '[2, 8]' is invalid" in verdict.error


# --- extension tests last: their builds started when the worker fixture was created
def test_load_inline_candidate(gpu_worker: EvalWorker) -> None:
    source = (CANDIDATES / "fused_elementwise_cuda.py").read_text()
    verdict = gpu_worker.run(submission("fused_elementwise", source, "cuda"))
    assert verdict.correct and verdict.flags == [], verdict
    assert verdict.speedup > 0 and "build" in verdict.stage_seconds
    again = gpu_worker.run(submission("fused_elementwise", source, "cuda-again"), "profile")
    assert again.correct and again.stage_seconds["build"] == 0.0 and again.ref_cached


def test_extension_that_never_built_with_a_fallback_is_rejected(gpu_worker: EvalWorker) -> None:
    # Static checks run before any candidate code: the silent fallback is refused before the
    # (broken) extension is built.
    verdict = run_case(gpu_worker, GPU_CASES / "cuda_build_fails.py")
    assert not verdict.correct and "try-fallback" in codes(verdict)
    assert verdict.stage_seconds.get("load") is None


def test_extension_running_only_reference_kernels_is_rejected(gpu_worker: EvalWorker) -> None:
    verdict = run_case(gpu_worker, GPU_CASES / "aten_only_extension.py")
    assert "custom-kernel-not-run" in codes(verdict), verdict
    assert "only kernels the reference launches" in " ".join(verdict.flags)


def _host_busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_timing_leaves_host_launch_latency_out() -> None:
    """A call that spends 0.3 ms on the host before its tiny kernel is timed at the kernel's GPU
    time (the pre-roll covers the host part); work left on a side stream is still counted."""
    import torch

    from specgen.eval.timing import Timer

    x = torch.zeros(1024, device="cuda:0")
    timer = Timer("cuda:0", l2_flush_mb=8)

    def slow_host_tiny_kernel(_: object) -> torch.Tensor:
        _host_busy(0.0003)
        return x.add(1)

    stats = timer.time(slow_host_tiny_kernel, [[0]], warmup=3, trials=20)
    assert stats.median_ms < 0.1, f"host time leaked into the sample: {stats.median_ms:.3f} ms"
    assert timer.hidden_work_trials == 0

    side = torch.cuda.Stream(device="cuda:0")

    def side_stream_work(_: object) -> torch.Tensor:
        with torch.cuda.stream(side):
            torch.cuda._sleep(5_000_000)   # a few ms on any clock the H200 runs at
        return x.add(1)

    stats = timer.time(side_stream_work, [[0]], warmup=2, trials=5)
    assert timer.hidden_work_trials >= 4 and stats.median_ms > 1.0, stats
