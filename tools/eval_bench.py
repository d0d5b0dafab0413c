"""Benchmark of the evaluation service on GPUs: throughput, wall-time split, speedup spread.

Two phases (run both with `--phase all`, or apart so that builds overlap other GPU work):

* `build`: every load_inline candidate is built into the shared cache, in parallel on CPU
  processes (KernelBench's own figures were taken with builds done beforehand the same way).
* `run`: the candidates (KernelBench-sized problems: the bundled problems at full scale; honest
  PyTorch, Triton and CUDA kernels and known reward hacks) are evaluated, stage "full" (load,
  correctness, cheat guards, timing), twice side by side:
    - `specgen` on --device: spare runners started ahead of need, reference timings cached;
    - `baseline` on --baseline-device: KernelBench's way with our evaluator: a fresh process per
      candidate started on the critical path, no spares, no reference-timing cache.
  Both clocks start when their worker starts (spare start-up is paid inside the measured time).
  Then one kernel's speedup is measured --repeats times, with the reference timing cached and
  with it measured again each time, and the spread reported.

Prints a table and writes `eval_bench.json` and `eval_bench.md` to --out.

    python tools/eval_bench.py --phase all --out out/
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specgen.eval import EvalOptions, EvalWorker  # noqa: E402
from specgen.eval.loader import candidate_from_text  # noqa: E402
from specgen.messages import CandidateSubmission, Verdict  # noqa: E402

PROBLEMS = REPO / "specgen" / "data" / "problems"
CANDIDATES = PROBLEMS / "candidates"
TESTS = REPO / "tests" / "eval"


@dataclass
class Case:
    name: str
    problem: str
    path: Path
    honest: bool
    expect: str = ""          # for a cheat: the flag code or error text it must be rejected for


def cases() -> list[Case]:
    honest = [Case(p.stem, p.stem.rsplit("_", 1)[0], p, True) for p in sorted(CANDIDATES.glob("*.py"))]
    honest += [Case(n, prob, TESTS / "honest" / f"{n}.py", True) for n, prob in (
        ("kernelbench_style_constants", "softmax"), ("layernorm_flat_params", "layernorm"),
        ("matmul_linear_relu_inplace", "matmul_bias_relu"),
        ("optional_triton_import", "fused_elementwise"))]
    cheats = [Case(n, "softmax", TESTS / folder / f"{n}.py", False, expect) for folder, n, expect in (
        ("gpu", "side_stream_hidden", "side-stream"),
        ("redteam", "side_stream_static", "side-stream"),
        ("gpu", "cuda_build_fails", "try-fallback"),
        ("gpu", "memo_beyond_floor", "beyond-floor"),
        ("redteam", "module_constants_shadow", "error"),
        ("redteam", "same_output_buffer", "same-output-buffer"),
        ("redteam", "changes_after_warmup", "error"))]
    cheats += [Case("layernorm_wrong_param_shape", "layernorm",
                    TESTS / "redteam" / "layernorm_wrong_param_shape.py", False, "parameter-mismatch"),
               Case("precision_bf16", "matmul_bias_relu", TESTS / "redteam" / "precision_bf16.py",
                    False, "precision")]
    # Interleave so that any prefix (the baseline may stop early) mixes kinds of work.
    mixed: list[Case] = []
    while honest or cheats:
        for group, take in ((honest, 2), (cheats, 1)):
            for _ in range(take):
                if group:
                    mixed.append(group.pop(0))
    return mixed


def submission(case: Case, tag: str) -> CandidateSubmission:
    return CandidateSubmission(job_id="bench", candidate_id=f"{case.name}-{tag}",
                               problem_name=case.problem,
                               problem_source=(PROBLEMS / f"{case.problem}.py").read_text(),
                               candidate_source=case.path.read_text())


def split(verdict: Verdict) -> dict[str, float]:
    """Wall time of one evaluation by kind: process start, compile, correctness, timing."""
    s = verdict.stage_seconds
    first = s.get("first_call", 0.0)
    return {
        "process_start": s.get("spare_wait", 0.0),
        "compile": s.get("build", 0.0) + s.get("load", 0.0) + first,
        "correctness": s.get("correctness", 0.0) - first + s.get("guards", 0.0),
        "timing": s.get("timing", 0.0) + s.get("ref_timing", 0.0),
        "total": s.get("total", 0.0),
    }


def judge(case: Case, verdict: Verdict) -> bool:
    """Did the evaluator decide this candidate the way it should?"""
    if case.honest:
        return verdict.correct
    if verdict.correct:
        return False
    if case.expect == "error":
        return verdict.error is not None
    return any(flag.startswith(case.expect + ":") for flag in verdict.flags)


def phase_build(args: argparse.Namespace) -> dict:
    worker = EvalWorker(args.device, Path(args.work) / "build", spare_processes=0,
                        options=EvalOptions(cache_dir=args.cache))
    worker.start()
    sources = [c for c in cases() if candidate_from_text(c.path.read_text()).needs_build]
    sources += [Case(p.stem, "", p, True) for p in (TESTS / "gpu").glob("*.py")
                if candidate_from_text(p.read_text()).needs_build and
                p.stem not in {c.name for c in sources}]
    began = time.monotonic()
    records = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(sources))) as pool:
        futures = {pool.submit(worker.build, c.path.read_text()): c for c in sources}
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            records[futures[future].name] = {
                "seconds": round(result.seconds, 2),
                "ok": [r.ok for r in result.records], "error": result.module_error}
    worker.close()
    out = {"wall_s": round(time.monotonic() - began, 2), "extensions": records}
    print(f"built {len(records)} candidates' extensions in parallel in {out['wall_s']} s: "
          + ", ".join(f"{k} {v['seconds']} s" for k, v in sorted(records.items())))
    return out


def run_mode(label: str, device: str, spares: int, cache_ref: bool, args: argparse.Namespace,
             work: Path, budget_s: float | None, cache: str | None = None) -> dict:
    options = EvalOptions(cache_dir=cache or args.cache, cache_ref_timing=cache_ref)
    began = time.monotonic()
    worker = EvalWorker(device, work, spare_processes=spares, options=options, name=label)
    worker.start()
    rows = []
    for case in cases():
        if budget_s is not None and time.monotonic() - began > budget_s:
            break
        started = time.monotonic() - began
        verdict = worker.run(submission(case, label), "full")
        rows.append({"name": case.name, "honest": case.honest, "expect": case.expect,
                     "ok": judge(case, verdict), "correct": verdict.correct,
                     "flags": [f.split(":", 1)[0] for f in verdict.flags],
                     "error": (verdict.error or "")[:200], "speedup": verdict.speedup,
                     "ref_ms": verdict.ref_ms, "candidate_ms": verdict.candidate_ms,
                     "started_s": round(started, 3),
                     "finished_s": round(time.monotonic() - began, 3), "split": split(verdict)})
        print(f"[{label}] {case.name}: {'ok ' if rows[-1]['ok'] else 'BAD'} correct="
              f"{verdict.correct} flags={rows[-1]['flags']} speedup={verdict.speedup} "
              f"total={verdict.stage_seconds.get('total')}", flush=True)
    wall = time.monotonic() - began
    worker.close()
    totals = {k: round(sum(r["split"][k] for r in rows), 2) for k in
              ("process_start", "compile", "correctness", "timing", "total")}
    return {"label": label, "device": device, "spares": spares, "cache_ref_timing": cache_ref,
            "evaluated": len(rows), "wall_s": round(wall, 2),
            "per_minute": round(60 * len(rows) / wall, 2), "split_s": totals, "rows": rows}


def spread(device: str, args: argparse.Namespace, cache_ref: bool, work: Path) -> dict:
    case = next(c for c in cases() if c.name == args.spread_candidate)
    options = EvalOptions(cache_dir=args.cache, cache_ref_timing=cache_ref)
    with EvalWorker(device, work, spare_processes=2, options=options) as worker:
        worker.run(submission(case, "spread-warm"), "full")  # fills the Triton and ref caches
        speedups = []
        for index in range(args.repeats):
            verdict = worker.run(submission(case, f"spread-{index}"), "full")
            if verdict.speedup:
                speedups.append(verdict.speedup)
    if len(speedups) < 2:
        return {"candidate": case.name, "cache_ref_timing": cache_ref, "speedups": speedups,
                "median": None, "range_over_median": None, "cv": None}
    median = statistics.median(speedups)
    return {"candidate": case.name, "cache_ref_timing": cache_ref, "speedups": speedups,
            "median": median, "range_over_median": (max(speedups) - min(speedups)) / median,
            "cv": statistics.pstdev(speedups) / statistics.mean(speedups)}


def phase_run(args: argparse.Namespace) -> dict:
    work = Path(args.work)
    results: dict[str, dict] = {}

    def specgen_then_spread() -> None:
        results["specgen"] = run_mode("specgen", args.device, args.spares, True, args,
                                      work / "specgen", None)
        results["spread_cached_ref"] = spread(args.device, args, True, work / "spread-cached")
        if args.spread_fresh_ref:
            results["spread_fresh_ref"] = spread(args.device, args, False, work / "spread-fresh")

    def baseline() -> None:
        # Its own cache: the extension libraries built beforehand are copied in (as KernelBench
        # had its builds done beforehand), but no Triton or reference-timing cache is shared.
        private = work / "baseline-cache"
        if (Path(args.cache) / "ext").is_dir():
            shutil.copytree(Path(args.cache) / "ext", private / "ext", dirs_exist_ok=True)
        results["baseline"] = run_mode("baseline", args.baseline_device, 0, False, args,
                                       work / "baseline", args.baseline_seconds, str(private))

    threads = [threading.Thread(target=specgen_then_spread)]
    if args.baseline_device:
        threads.append(threading.Thread(target=baseline))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if "baseline" in results:
        done = {r["name"] for r in results["baseline"]["rows"]}
        subset = [r for r in results["specgen"]["rows"] if r["name"] in done]
        # specgen's time on exactly the candidates the baseline finished
        results["specgen_on_baseline_subset"] = {
            "evaluated": len(subset),
            "busy_s": round(sum(r["split"]["total"] for r in subset), 2)}
    return results


def report(results: dict) -> str:
    lines = ["| mode | device | spares | ref cache | candidates | wall s | candidates/min | "
             "process start s | compile s | correctness s | timing s | decided right |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key in ("specgen", "baseline"):
        if key not in results:
            continue
        r = results[key]
        s = r["split_s"]
        right = sum(row["ok"] for row in r["rows"])
        lines.append(f"| {key} | {r['device']} | {r['spares']} | {r['cache_ref_timing']} | "
                     f"{r['evaluated']} | {r['wall_s']} | {r['per_minute']} | "
                     f"{s['process_start']} | {s['compile']} | {s['correctness']} | "
                     f"{s['timing']} | {right}/{r['evaluated']} |")
    for key in ("spread_cached_ref", "spread_fresh_ref"):
        if key in results and results[key]["median"] is not None:
            sp = results[key]
            lines.append(f"\n{key}: {sp['candidate']} speedup median {sp['median']:.3f}, "
                         f"(max-min)/median {100 * sp['range_over_median']:.2f}%, "
                         f"CV {100 * sp['cv']:.2f}% over {len(sp['speedups'])} runs")
    if "specgen" in results:
        lines.append("\n| candidate | honest | expected | correct | flags | speedup | decided right |")
        lines.append("| --- | --- | --- | --- | --- | --- | --- |")
        for row in results["specgen"]["rows"]:
            speed = f"{row['speedup']:.2f}" if row["speedup"] else "-"
            lines.append(f"| {row['name']} | {row['honest']} | {row['expect'] or 'accept'} | "
                         f"{row['correct']} | {','.join(row['flags']) or '-'} | {speed} | "
                         f"{row['ok']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=("build", "run", "all"), default="all")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--baseline-device", default="cuda:1",
                        help="GPU for the KernelBench-style baseline ('' to skip it)")
    parser.add_argument("--baseline-seconds", type=float, default=150.0,
                        help="stop starting baseline candidates after this long")
    parser.add_argument("--spares", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--spread-candidate", default="softmax_triton")
    parser.add_argument("--spread-fresh-ref", action="store_true",
                        help="also repeat the spread runs with the reference timed each time")
    parser.add_argument("--cache", default=None, help="shared build/timing cache directory")
    parser.add_argument("--work", default=None)
    parser.add_argument("--out", default=str(REPO / "out"))
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    scratch = tempfile.mkdtemp(prefix="eval-bench-")
    args.work = args.work or scratch
    args.cache = args.cache or str(Path(scratch) / "cache")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"date": time.strftime("%Y-%m-%d"), "argv": sys.argv[1:]}
    if args.phase in ("build", "all"):
        results["build"] = phase_build(args)
        (out / "eval_bench_build.json").write_text(json.dumps(results["build"], indent=1))
    if args.phase in ("run", "all"):
        build_file = out / "eval_bench_build.json"
        if "build" not in results and build_file.is_file():
            results["build"] = json.loads(build_file.read_text())
        try:
            import torch
            results["machine"] = {"gpu": torch.cuda.get_device_name(0),
                                  "gpus": torch.cuda.device_count(), "cpus": os.cpu_count(),
                                  "torch": str(torch.__version__)}
        except Exception as exc:  # noqa: BLE001 - the machine line is informative only
            results["machine"] = {"error": str(exc)}
        results.update(phase_run(args))
        table = report(results)
        print(table)
        (out / "eval_bench.md").write_text(table + "\n")
        (out / "eval_bench.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
