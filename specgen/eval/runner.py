"""Entry point of a runner subprocess: start up ahead of need, then evaluate exactly one job.

`python -m specgen.eval.runner --mode run|build --job-fd N --result-fd M --device DEV`

Start-up (import torch and Triton, create the CUDA context, warm cuBLAS) happens before any job
exists, so a worker keeps such processes ready as spares; then the runner writes `RunnerReady`,
blocks until its one job arrives, evaluates it, writes the result and exits without teardown.
A runner never takes a second job: whatever the candidate did to the process (patched modules,
a poisoned CUDA context, leaked threads) dies with it.

The worker sets the environment: `CUDA_VISIBLE_DEVICES` to the one GPU of the worker (or none),
`TRITON_INTERPRET=1` on the CPU, cache and build directories. A watchdog thread exits the runner
when its worker goes away, so no runner outlives it. Inside a sandbox (eval/sandbox.py) the
runner's PID namespace dies with it: so does everything the candidate started.
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import select
import sys
import threading
import time
from typing import Any


def _watch_worker(job_fd: int) -> None:
    """Exit once the worker is gone: it holds the job pipe's write end until it kills us, so a
    hang-up there means it died (in a sandbox the runner's parent is the namespace's init)."""
    poller = select.poll()
    poller.register(job_fd, select.POLLHUP | select.POLLERR)
    while True:
        for _, event in poller.poll():
            if event & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                os._exit(3)


def _vm_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def main(argv: list[str] | None = None) -> int:
    began = time.monotonic()
    parser = argparse.ArgumentParser(prog="specgen.eval.runner")
    parser.add_argument("--mode", choices=("run", "build"), required=True)
    parser.add_argument("--job-fd", type=int, required=True)
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    threading.Thread(target=_watch_worker, args=(args.job_fd,), daemon=True,
                     name="specgen-worker-watch").start()

    import torch

    from specgen.eval.protocol import FrameReader, write_frame
    from specgen.messages import BuildJob, BuildResult, RunJob, RunnerReady

    device = args.device
    capability = ""
    name = _cpu_name()
    triton_version = ""
    if args.mode == "run":
        try:
            import triton
            triton_version = triton.__version__
        except ImportError:
            pass
        if device.startswith("cuda"):
            torch.cuda.set_device(device)
            torch.zeros(1, device=device)
            major, minor = torch.cuda.get_device_capability(device)
            capability = f"{major}.{minor}"
            name = torch.cuda.get_device_name(device)
            warm = torch.ones(64, 64, device=device)
            (warm @ warm).sum().item()  # creates the cuBLAS handle now, not in the first trial
            _warm_profiler(torch, warm)
        from specgen.eval import harness  # noqa: F401 - imported ahead of the job
    write_frame(args.result_fd, RunnerReady(
        pid=os.getpid(), device=device, device_name=name, capability=capability,
        torch_version=str(torch.__version__), triton_version=str(triton_version),
        startup_s=time.monotonic() - began))

    reader = FrameReader(args.job_fd)
    if args.mode == "build":
        job = reader.read(BuildJob)
        if job is None:
            os._exit(0)
        result = _build(job)
        write_frame(args.result_fd, result)
        sys.stdout.flush()
        os._exit(0)

    job = reader.read(RunJob)
    if job is None:
        os._exit(0)  # the worker closed the pipe: a spare that was never used
    _limit_memory(job.options.memory_limit_mb, device, job.options.gpu_memory_fraction)
    from specgen.eval.harness import evaluate_run_job
    result = evaluate_run_job(job, device, name)
    sys.stdout.flush()
    sys.stderr.flush()
    write_frame(args.result_fd, result)
    os._exit(0)


def _warm_profiler(torch: Any, tensor: Any) -> None:
    """The first profiler session of a process initializes CUPTI and imports torch._dynamo
    (seconds); the guards profile every GPU candidate, so that cost is paid here, ahead of need."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        (tensor + 1).sum().item()
    prof.profiler.kineto_results.events()


def _limit_memory(limit_mb: int, device: str, gpu_fraction: float) -> None:
    """Cap what the candidate can add on top of what the runner holds after start-up."""
    if device.startswith("cuda"):
        # CUDA reserves huge virtual ranges, so an address-space limit cannot be used; the worker
        # watches resident memory instead, and the GPU allocator gets a cap of its own.
        import torch
        torch.cuda.set_per_process_memory_fraction(gpu_fraction, device)
        return
    limit = _vm_bytes() + limit_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _build(job: "BuildJob") -> "BuildResult":
    from pathlib import Path

    from specgen.eval import extensions
    from specgen.eval.extensions import KernelLedger
    from specgen.eval.loader import candidate_from_text, exec_source
    from specgen.messages import BuildResult

    began = time.monotonic()
    ledger = KernelLedger()
    candidate = candidate_from_text(job.candidate_source)
    extensions.install("build", Path(job.cache_dir), Path(job.build_dir), ledger,
                       scope=candidate.sha256)
    module_error = None
    try:
        exec_source(candidate, f"specgen_candidate_{candidate.sha256[:12]}",
                    Path(job.build_dir) / "sources")
    except BaseException as exc:  # noqa: BLE001 - the candidate's module may raise anything
        module_error = f"{type(exc).__name__}: {exc}"[:2000]
    return BuildResult(records=ledger.builds, module_error=module_error,
                       seconds=time.monotonic() - began)


if __name__ == "__main__":
    sys.exit(main())
