"""Where a `load_inline` build's time goes, and what the evaluation's builds save of it.

    python tools/build_bench.py [--kind cuda|cpp] [--n 6] [--json out.json] [--worker]

Builds N extensions of distinct sources, shaped like public KernelBench candidates (CUDA: a
`torch/extension.h` + a `__global__` kernel + a host wrapper in `cuda_sources`, its declaration in
`cpp_sources`, `functions=`, `extra_cuda_cflags=["-O3"]`; cpp: an OpenMP loop in `cpp_sources`
with `extra_cflags=["-O3", "-fopenmp"]`), each in a fresh build directory, twice: as torch builds
it, and with the precompiled `torch/extension.h` of specgen/eval/pch.py first on main.cpp's include
path, alternating which goes first. Per build: the wall time of `load_inline`, the time of each
ninja step (from the build directory's `.ninja_log`: main.cpp, cuda.cu, the link) and the CPU
seconds of the compilers. One more CUDA build runs nvcc with `--time` to split the .cu compile
into nvcc's own phases. Each library is loaded and called (CUDA: on the GPU where there is one,
else the import must fail only for the lack of one).

`--worker` also builds one candidate through an `EvalWorker` twice (build runner, publication,
the per-source marker), the second time from the content cache.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CUDA_KERNEL = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void scaled_relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        const float v = x[i] * SCALE;
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

torch::Tensor scaled_relu(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "scaled_relu: x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "scaled_relu: float32 expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t n = xc.numel();
    if (n == 0) return y;
    const int threads = 256;
    const int blocks = (int)std::min<int64_t>((n + threads - 1) / threads, 65535);
    scaled_relu_kernel<<<blocks, threads>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
CUDA_DECLARATION = "torch::Tensor scaled_relu(torch::Tensor x);"

CPP_KERNEL = r"""
#include <torch/extension.h>
#include <omp.h>

torch::Tensor scaled_relu(torch::Tensor x) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "scaled_relu: float32 expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    const int64_t n = xc.numel();
    #pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) {
        const float v = in[i] * SCALE;
        out[i] = v > 0.0f ? v : 0.0f;
    }
    return y;
}
"""


def arguments(kind: str, index: int, tag: str) -> dict:
    """Distinct sources per build (the scale differs), so nothing is reused between them."""
    scale = f"#define SCALE {1.0 + index / 64 + (0.5 if tag == 'pch' else 0.0):.6f}f\n"
    name = f"bench_{kind}_{tag}_{index}_{os.getpid()}"
    if kind == "cuda":
        return {"name": name, "cpp_sources": CUDA_DECLARATION, "cuda_sources": scale + CUDA_KERNEL,
                "functions": ["scaled_relu"], "extra_cuda_cflags": ["-O3"], "verbose": False}
    return {"name": name, "cpp_sources": scale + CPP_KERNEL, "functions": ["scaled_relu"],
            "extra_cflags": ["-O3", "-fopenmp"], "extra_ldflags": ["-fopenmp"], "verbose": False}


def ninja_steps(directory: Path) -> dict[str, float]:
    """Seconds per output from ninja's log (start and end in milliseconds)."""
    steps: dict[str, float] = {}
    log = directory / ".ninja_log"
    if not log.is_file():
        return steps
    for line in log.read_text().splitlines():
        if line.startswith("#"):
            continue
        start, end, _, output, *_ = line.split("\t")
        label = {"main.o": "main.cpp", "cuda.cuda.o": "cuda.cu"}.get(output, "link" if output.endswith(".so") else output)
        steps[label] = (int(end) - int(start)) / 1000
    return steps


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def build_one(kind: str, index: int, tag: str, root: Path, pch_dir: Path | None,
              extra_cuda: list[str] | None = None) -> dict:
    import torch
    from torch.utils.cpp_extension import load_inline

    args = arguments(kind, index, tag)
    directory = root / f"{tag}-{index}"
    directory.mkdir(parents=True)
    if pch_dir is not None:
        # What the build runner does (specgen/eval/extensions.py): -I for the host compile only.
        args["extra_cflags"] = [f"-I{pch_dir}", *args.get("extra_cflags", [])]
    if extra_cuda:
        args["extra_cuda_cflags"] = [*args["extra_cuda_cflags"], *extra_cuda]
    cpu = children_cpu()
    began = time.perf_counter()
    error = None
    try:
        module = load_inline(build_directory=str(directory), **args)
    except Exception as exc:  # noqa: BLE001 - reported: the import may fail only for want of a GPU
        module, error = None, f"{type(exc).__name__}: {str(exc)[-600:]}"
    wall = time.perf_counter() - began
    built = (directory / f"{args['name']}.so").is_file()
    check = "not built"
    if module is not None:
        device = "cuda" if kind == "cuda" else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            check = "built; no GPU here to call it"
        else:
            x = torch.randn(1 << 20, device=device)
            scale = float(args["cuda_sources" if kind == "cuda" else "cpp_sources"].split()[2].rstrip("f"))
            got = module.scaled_relu(x)
            check = "ok" if torch.allclose(got, torch.relu(x * scale)) else "WRONG OUTPUT"
    elif built:
        check = f"built; import failed: {error}"
    return {"tag": tag, "index": index, "wall_s": round(wall, 3), "steps": ninja_steps(directory),
            "compiler_cpu_s": round(children_cpu() - cpu, 3), "check": check,
            "error": None if built else error}


def nvcc_phases(kind: str, root: Path) -> dict[str, float]:
    """One more CUDA build with nvcc's own per-phase clock (`--time`)."""
    path = root / "nvcc_time.csv"
    build_one(kind, 999, "nvcctime", root, None, ["--time", str(path)])
    phases: dict[str, float] = {}
    if path.is_file():
        with path.open() as handle:
            for row in csv.reader(handle):
                # source file, phase, inputs, output, arch, tool, metric (ms), unit
                if len(row) >= 8 and row[7].strip() == "ms" and row[0].strip():
                    phase = row[1].strip()
                    try:
                        phases[phase] = phases.get(phase, 0.0) + float(row[6]) / 1000
                    except ValueError:
                        continue
    return {k: round(v, 3) for k, v in phases.items()}


def worker_builds(kind: str, root: Path) -> dict:
    """One candidate through an EvalWorker: compiled (build runner), then again from the content
    cache, then from a new worker on the same cache (a restart)."""
    from specgen.eval import EvalOptions, EvalWorker

    args = arguments(kind, 0, "worker")
    source = ("import torch\nfrom torch.utils.cpp_extension import load_inline\n"
              f"ext = load_inline(**{args!r})\n"
              "class ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
              "        return ext.scaled_relu(x)\n")
    device = "cuda:0" if kind == "cuda" and os.environ.get("SPECGEN_BENCH_GPU") else "cpu"
    times, records, sandbox = [], [], ""
    for restart in range(2):
        worker = EvalWorker(device, root / "worker", spare_processes=0,
                            options=EvalOptions(sandbox="optional"))
        worker.start()
        try:
            for _ in range(2 - restart):
                began = time.perf_counter()
                result = worker.build(source)
                times.append(round(time.perf_counter() - began, 4))
                records = [(r.name, r.ok, r.cached, (r.error or "")[:300]) for r in result.records]
            sandbox = worker.sandbox_status.kind
        finally:
            worker.close()
    return {"first_s": times[0], "repeat_s": times[1], "after_restart_s": times[2],
            "sandbox": sandbox, "records": records}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=("cuda", "cpp"), default="cuda")
    parser.add_argument("--n", type=int, default=6)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--no-pch", action="store_true")
    opts = parser.parse_args()

    import torch

    from specgen.eval import pch

    import torch.utils.cpp_extension as cpp_extension

    if opts.kind == "cuda" and cpp_extension.CUDA_HOME is None and shutil.which("nvcc"):
        # A CPU build of torch with nvcc beside it: the compiles are measured, the link fails
        # (no libc10_cuda), and the import with it.
        cpp_extension.CUDA_HOME = str(Path(shutil.which("nvcc")).resolve().parent.parent)
    if opts.kind == "cuda" and not os.environ.get("TORCH_CUDA_ARCH_LIST") and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    if opts.kind == "cuda":
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    report: dict = {"kind": opts.kind, "n": opts.n, "torch": str(torch.__version__),
                    "cores": os.cpu_count(), "arch": os.environ.get("TORCH_CUDA_ARCH_LIST", "")}
    with tempfile.TemporaryDirectory(prefix="specgen-build-bench-") as scratch:
        root = Path(scratch)
        pch_dir = None
        if not opts.no_pch:
            flags = arguments(opts.kind, 0, "base").get("extra_cflags", [])
            began = time.perf_counter()
            pch_dir = pch.make(root / "cache", opts.kind == "cuda", flags)
            report["pch_make_s"] = round(time.perf_counter() - began, 3)
            report["pch_bytes"] = (pch_dir / "torch" / "extension.h.gch").stat().st_size if pch_dir else 0
            found = pch.lookup(root / "cache", opts.kind == "cuda", flags)
            report["pch_found_by_lookup"] = found == pch_dir and found is not None
        rows = []
        for index in range(opts.n):
            order = ["base", "pch"] if index % 2 == 0 else ["pch", "base"]
            for tag in order:
                if tag == "pch" and pch_dir is None:
                    continue
                row = build_one(opts.kind, index, tag, root, pch_dir if tag == "pch" else None)
                rows.append(row)
                print(json.dumps(row), flush=True)
        report["builds"] = rows
        summary = {}
        for tag in ("base", "pch"):
            mine = [r for r in rows if r["tag"] == tag and r["error"] is None]
            if not mine:
                continue
            steps = sorted({s for r in mine for s in r["steps"]})
            summary[tag] = {"p50_wall_s": round(statistics.median(r["wall_s"] for r in mine), 3),
                            "p50_compiler_cpu_s": round(statistics.median(r["compiler_cpu_s"] for r in mine), 3),
                            **{f"p50_{s}_s": round(statistics.median(r["steps"].get(s, 0.0) for r in mine), 3)
                               for s in steps}}
        report["summary"] = summary
        if opts.kind == "cuda":
            report["nvcc_phases_s"] = nvcc_phases(opts.kind, root)
        if opts.worker:
            report["worker"] = worker_builds(opts.kind, root)
    print(json.dumps({k: v for k, v in report.items() if k != "builds"}, indent=1))
    if opts.json:
        opts.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
