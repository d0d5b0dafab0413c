"""Reference points for the judge's time of one call: each candidate and its problem's Model timed
in this process, three ways, with no judge and no sandbox (a measuring tool, never a verdict).

* `device_ms`: the GPU's execution of the call only. A GPU busy-wait queued first outlasts the
  host's enqueueing of the call, and CUDA events bracket the call (nvbench's blocking kernel; the
  method of the evaluator before the judge/runner split, b70dcbb).
* `events_ms`: CUDA events around the call, the GPU idle before it (KernelBench's method): the
  host's time to launch the call's kernels, after the first, counts wherever the GPU waits for it.
* `latency_ms`: the host's clock from the call to the device synchronized after it.

The judge measures from its own process (docs/evaluation.md, "Timing on the GPU"), so it cannot
hide the candidate's host launch time behind a busy-wait the candidate's process could skip; these
three say how far apart the definitions are for a given program. Each trial uses the next of
three input sets (fresh values, so no output can be reused) after overwriting a buffer larger
than the L2 cache. Used by tools/verdict_bench.py's cost phase; alone:

    python tools/call_times.py --device cuda:0 --cache-dir DIR FILE.py [FILE.py ...]

prints JSON: {file: {"candidate": {...}, "reference": {...}}}. `--cache-dir` is the evaluation's
extension cache, so extensions the judge built are loaded, not built again.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _load(path: Path, cache_dir: Path, work: Path, device: str):
    """(candidate model, reference model, the problem module) on `device`, built as the judge
    builds them (the problem's init inputs after the same seed)."""
    import torch

    from specgen.eval import extensions
    from specgen.eval.extensions import KernelLedger
    from specgen.eval.loader import candidate_from_text, exec_source, problem_from_text
    from tests.eval.conftest import candidate_submission

    submission = candidate_submission(path)
    problem = problem_from_text(submission.problem_source, name=submission.problem_name)
    candidate = candidate_from_text(submission.candidate_source)
    problem_module = exec_source(problem, f"times_problem_{problem.sha256[:12]}", work)
    extensions.install("run", cache_dir, work / "build", KernelLedger(), scope=candidate.sha256,
                       device=device)
    candidate_module = exec_source(candidate, f"times_candidate_{candidate.sha256[:12]}", work)
    init = list(problem_module.get_init_inputs())
    models = []
    for cls in (candidate_module.ModelNew, problem_module.Model):
        torch.manual_seed(0)
        model = cls(*init)
        models.append(model.to(device) if isinstance(model, torch.nn.Module) else model)
    return models[0], models[1], problem_module


def _times(model, input_sets: list, trials: int, device: str) -> dict:
    import torch

    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device=device)
    with torch.no_grad():
        enqueue = []
        for i in range(3):                                  # warm-up; the host's enqueue time
            torch.cuda.synchronize()
            began = time.perf_counter()
            model(*input_sets[i % len(input_sets)])
            enqueue.append(time.perf_counter() - began)
            torch.cuda.synchronize()
        # The busy-wait's length: three times the host's enqueue, in GPU cycles (calibrated).
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(1_000_000)
        end.record()
        end.synchronize()
        cycles_per_ms = 1_000_000 / max(start.elapsed_time(end), 1e-6)
        sleep_cycles = int(3 * statistics.median(enqueue) * 1e3 * cycles_per_ms) + 10_000
        found: dict[str, list[float]] = {"device_ms": [], "events_ms": [], "latency_ms": []}
        for trial in range(trials):
            inputs = input_sets[trial % len(input_sets)]
            for way in found:
                flush.zero_()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                began = time.perf_counter()
                if way == "device_ms":
                    torch.cuda._sleep(sleep_cycles)
                start.record()
                model(*inputs)
                end.record()
                torch.cuda.synchronize()
                wall = (time.perf_counter() - began) * 1e3
                found[way].append(wall if way == "latency_ms" else start.elapsed_time(end))
    return {way: round(statistics.median(values), 4) for way, values in found.items()}


def call_times(paths: list[Path], device: str, cache_dir: Path, trials: int = 30) -> dict:
    import torch

    import torch.utils.cpp_extension as cpp_extension

    out: dict = {}
    real_load_inline = cpp_extension.load_inline
    for path in paths:
        work = Path(tempfile.mkdtemp(prefix="specgen-call-times-"))
        # Each file's candidate gets the evaluation's load_inline of its own scope, over the real one.
        cpp_extension.load_inline = real_load_inline
        try:
            candidate, reference, problem = _load(path, cache_dir, work, device)
            input_sets = []
            for seed in range(3):
                torch.manual_seed(1000 + seed)
                with torch.device(device):
                    input_sets.append([x.to(device) if isinstance(x, torch.Tensor) else x
                                       for x in problem.get_inputs()])
            out[path.name] = {"candidate": _times(candidate, input_sets, trials, device),
                              "reference": _times(reference, input_sets, trials, device)}
        except Exception as exc:  # noqa: BLE001 - one file's failure is reported, not fatal
            out[path.name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        finally:
            torch.cuda.empty_cache()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--trials", type=int, default=30)
    args = parser.parse_args()
    if not args.device.startswith("cuda"):
        raise SystemExit("call_times.py times CUDA calls: give --device cuda:N")
    sys.path.insert(0, str(REPO))
    print(json.dumps(call_times(args.files, args.device, args.cache_dir, args.trials)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
