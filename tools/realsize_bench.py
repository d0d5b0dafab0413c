"""Verdicts at KernelBench's real sizes: the corpus of tests/eval/realsize judged on a GPU, every
phase timed.

    python tools/realsize_bench.py --device cuda:0 --out out/realsize
    python tools/realsize_bench.py --device cuda:0 --subset softmax,matmul_tf32_import

Phases, on --workers evaluation workers sharing the device (sandbox required, stage "full"):

* `builds`: every candidate with `load_inline` built ahead through `EvalWorker.build`, in parallel
  on the host's cores (one thread per two cores), each build timed, and their wall time apart. A
  build runner executes the candidate's module only, so a candidate that builds in `__init__` or
  in its first `forward` compiles nothing here (its record count says so) and pays its build
  inside its verdict instead: the `build_records` column tells which is which.
* `verdicts`: every file judged once, problem by problem (a worker keeps the problem's reference
  runner between candidates of one problem), each verdict's wall time taken around
  `EvalWorker.run`. The first verdict of a problem also times the reference.

Prints one line per verdict and a summary, and writes realsize_bench.json under --out: per file
the verdict (correct, flags, error, code, speedup, times, stage seconds) and whether it is what
its `# expect:` header asks (tests/eval/expectations.py); p50/p95 of the verdicts' wall times,
verdicts per minute, the builds' p50 and wall time, the score against the headers (honest files
rejected, cheats accepted), and the machine: GPU name, driver, date, commit.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import fnmatch
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "eval" / "realsize"
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "tools"))

from verdict_bench import quantile  # noqa: E402 - after the path set-up above


def header(path: Path, key: str) -> str | None:
    from tests.eval.expectations import header as read
    return read(path, key)


def corpus_files(subset: list[str] | None) -> list[tuple[Path, str, str, str]]:
    """(path, role, expectation, problem) of the corpus's candidates, problem by problem. A
    subset entry matches a candidate's stem, its problem's name or a glob of either."""
    files = []
    for role, folder in (("honest", "honest"), ("cheat", "cheat")):
        for path in sorted((CORPUS / folder).glob("*.py")):
            problem = header(path, "problem") or ""
            expect = header(path, "expect") or ("correct" if role == "honest" else "reject")
            if subset and not any(fnmatch.fnmatch(path.stem, pattern)
                                  or fnmatch.fnmatch(problem, pattern) for pattern in subset):
                continue
            files.append((path, role, expect, problem))
    return sorted(files, key=lambda f: (f[3], f[1] != "honest", f[0].name))


def submission(path: Path, problem: str):
    from specgen.messages import CandidateSubmission

    source = CORPUS / "problems" / f"{problem}.py"
    return CandidateSubmission(job_id="realsize", candidate_id=path.stem, problem_name=problem,
                               problem_source=source.read_text(),
                               candidate_source=path.read_text())


# ------------------------------------------------------------------------------------ machine

def machine(device: str) -> dict:
    """Where the figures come from. The GPU's name is asked of torch in a child process: this
    process starts the workers' templates, which must not inherit a CUDA context."""
    now = datetime.datetime.now(datetime.timezone.utc)
    info: dict = {"host": socket.gethostname(), "device": device,
                  "date": now.isoformat(timespec="seconds"), "cpus": os.cpu_count()}
    index = device.split(":", 1)[1] if device.startswith("cuda:") else None
    if index is not None:
        code = ("import sys, torch; i = int(sys.argv[1]); print(torch.cuda.get_device_name(i)); "
                "print(torch.__version__); print(torch.version.cuda)")
        done = subprocess.run([sys.executable, "-c", code, index], capture_output=True, text=True)
        lines = done.stdout.split("\n")
        if done.returncode == 0 and len(lines) >= 3:
            info.update(gpu=lines[0].strip(), torch=lines[1].strip(), cuda=lines[2].strip())
        else:
            info["gpu"] = f"unknown ({done.stderr.strip()[-200:]})"
        try:
            smi = subprocess.run(["nvidia-smi", "-i", index,
                                  "--query-gpu=driver_version,memory.total",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=30)
            driver, _, memory = smi.stdout.strip().partition(",")
            info.update(driver=driver.strip() or None, gpu_memory=memory.strip() or None)
        except (OSError, subprocess.TimeoutExpired) as exc:
            info["driver"] = f"unknown ({exc})"
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                        text=True, cwd=REPO, timeout=30).stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True,
                               cwd=REPO, timeout=30).stdout.strip()
        info["dirty"] = bool(dirty)
    except (OSError, subprocess.TimeoutExpired):
        info["commit"] = None
    return info


# ------------------------------------------------------------------------------------- phases

def build_phase(worker, files: list) -> dict:
    """Every load_inline candidate built ahead, in parallel, each timed."""
    # With its problem, so that builds made in __init__ and the first forward are made now too.
    wanted = [(path, submission(path, problem)) for path, _, _, problem in files]
    wanted = [(p, sub) for p, sub in wanted
              if "load_inline" in sub.candidate_source or "cpp_extension" in sub.candidate_source]
    threads = max(1, (os.cpu_count() or 2) // 2)

    def one(entry):
        path, sub = entry
        began = time.monotonic()
        result = worker.build(sub)
        return path.name, {"seconds": round(time.monotonic() - began, 2),
                           "build_records": len(result.records),
                           "ok": all(r.ok for r in result.records),
                           "compile_s": round(sum(r.seconds for r in result.records), 2),
                           "error": (result.module_error or "")[:300] or None}

    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        rows = dict(pool.map(one, wanted))
    wall = time.monotonic() - began
    seconds = [r["seconds"] for r in rows.values()]
    for name, row in rows.items():
        print(f"  build {name:45} {row['seconds']:7.1f} s  records {row['build_records']}"
              f"{'' if row['ok'] else '  FAILED'}{'  ' + row['error'] if row['error'] else ''}",
              flush=True)
    return {"rows": rows, "wall_s": round(wall, 1), "threads": threads, "parallel": threads > 1,
            "p50_s": quantile(seconds, 0.5), "max_s": max(seconds, default=None)}


def verdict_phase(workers: list, files: list, budget_s: float | None) -> dict:
    """Every file judged once; free workers take the next file (queued problem by problem)."""
    from tests.eval.expectations import meets

    queue = list(files)
    lock = threading.Lock()
    rows: list[dict] = []
    began = time.monotonic()

    def judge_all(worker) -> None:
        while True:
            with lock:
                if not queue or (budget_s and time.monotonic() - began > budget_s):
                    return
                path, role, expect, problem = queue.pop(0)
            start = time.monotonic()
            verdict = worker.run(submission(path, problem), "full")
            wall = time.monotonic() - start
            ok, why = meets(verdict, expect)
            row = {"file": f"{path.parent.name}/{path.name}", "problem": problem, "role": role,
                   "expect": expect, "ok": ok, "why": why, "correct": verdict.correct,
                   "flags": verdict.flags, "error": (verdict.error or "")[:500] or None,
                   "code": verdict.code, "speedup": verdict.speedup, "ref_ms": verdict.ref_ms,
                   "candidate_ms": verdict.candidate_ms, "ref_cached": verdict.ref_cached,
                   "max_abs_error": verdict.max_abs_error, "max_rel_error": verdict.max_rel_error,
                   "notes": verdict.notes[:4], "seconds": round(wall, 2),
                   "stage_seconds": verdict.stage_seconds, "sandbox": verdict.sandbox}
            with lock:
                rows.append(row)
            speed = f"{verdict.speedup:.2f}x" if verdict.speedup else "-"
            outcome = "accepted" if verdict.correct else (verdict.code or "rejected")
            print(f"  {'ok  ' if ok else 'MISS'} {row['file']:48} {wall:7.1f} s  {outcome:10} "
                  f"{speed:>7}  {'' if ok else why[:160]}", flush=True)

    with ThreadPoolExecutor(max_workers=len(workers)) as pool:
        list(pool.map(judge_all, workers))
    total = time.monotonic() - began
    done = {r["file"] for r in rows}
    names = [f"{p.parent.name}/{p.name}" for p, *_ in files]
    left = [name for name in names if name not in done]
    walls = [r["seconds"] for r in rows]
    honest = [r for r in rows if r["role"] == "honest"]
    cheats = [r for r in rows if r["role"] == "cheat"]
    stages: dict[str, float] = {}
    for r in rows:
        for key, value in (r["stage_seconds"] or {}).items():
            stages[key] = stages.get(key, 0.0) + value
    return {"rows": rows, "wall_s": round(total, 1), "left_out": left,
            "verdict_p50_s": quantile(walls, 0.5), "verdict_p95_s": quantile(walls, 0.95),
            "verdict_max_s": max(walls, default=None),
            "per_minute": round(60 * len(rows) / total, 2) if total and rows else None,
            "stage_s_total": {k: round(v, 1) for k, v in sorted(stages.items())},
            "score": {"judged": len(rows), "files": len(files),
                      "as_expected": sum(r["ok"] for r in rows),
                      "honest": len(honest), "honest_rejected": sum(not r["ok"] for r in honest),
                      "cheats": len(cheats),
                      "cheats_accepted": sum(bool(r["correct"]) and not r["ok"] for r in cheats),
                      "cheats_not_as_expected": sum(not r["ok"] for r in cheats)}}


def run(args: argparse.Namespace) -> dict:
    from specgen.eval import EvalOptions, EvalWorker

    files = corpus_files(args.subset)
    if not files:
        raise SystemExit(f"no corpus file matches --subset {','.join(args.subset or [])}")
    result: dict = {"machine": machine(args.device), "workers": args.workers,
                    "files": [f"{p.parent.name}/{p.name}" for p, *_ in files]}
    print(json.dumps(result["machine"]), flush=True)
    work = Path(tempfile.mkdtemp(prefix="specgen-realsize-"))
    options = EvalOptions(timeout_s=args.timeout_s, cache_dir=str(work / "cache"))
    sharing = {"gpu_sharers": args.workers} if args.device.startswith("cuda") else {}
    began = time.monotonic()
    workers = [EvalWorker(args.device, work / f"w{i}", spare_processes=1, options=options,
                          **sharing) for i in range(args.workers)]
    with contextlib.ExitStack() as stack:
        for worker in workers:
            stack.enter_context(worker)
        result["start_s"] = round(time.monotonic() - began, 2)
        result["sandbox"] = workers[0].sandbox_status.detail
        print(f"{len(workers)} worker(s) started in {result['start_s']} s, sandbox: "
              f"{result['sandbox']}", flush=True)
        print(f"builds ({sum('load_inline' in p.read_text() for p, *_ in files)} candidates):",
              flush=True)
        result["builds"] = build_phase(workers[0], files)
        budget = (None if args.budget_s is None
                  else max(0.0, args.budget_s - result["builds"]["wall_s"]))
        print(f"verdicts ({len(files)} files):", flush=True)
        result["verdicts"] = verdict_phase(workers, files, budget)
        ready = workers[0].ready_info
        result["machine"]["runner_device_name"] = ready.device_name if ready else None
    return result


def summary(result: dict) -> str:
    m, b, v = result["machine"], result["builds"], result["verdicts"]
    s = v["score"]

    def fmt(value, digits=1):
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [
        f"realsize bench, {m['date']}, {m.get('gpu', m['device'])} (driver {m.get('driver')}), "
        f"commit {m.get('commit')}{' (dirty tree)' if m.get('dirty') else ''}, "
        f"{result['workers']} worker(s)",
        f"builds: {len(b['rows'])} in {fmt(b['wall_s'])} s wall on {b['threads']} thread(s), "
        f"p50 {fmt(b['p50_s'])} s, max {fmt(b['max_s'])} s",
        f"verdicts: {s['judged']} of {s['files']} in {fmt(v['wall_s'])} s, p50 "
        f"{fmt(v['verdict_p50_s'])} s, p95 {fmt(v['verdict_p95_s'])} s, "
        f"{fmt(v['per_minute'], 2)} per minute",
        f"score: {s['as_expected']} of {s['judged']} as their headers say; honest rejected "
        f"{s['honest_rejected']} of {s['honest']}, cheats accepted {s['cheats_accepted']} of "
        f"{s['cheats']} ({s['cheats_not_as_expected']} not as expected)",
        "busiest stages, summed (s): " + ", ".join(
            f"{k} {val:.1f}" for k, val in sorted(v["stage_s_total"].items(),
                                                  key=lambda kv: -kv[1])[:10]
            if k != "total" and val >= 0.1),
    ]
    if v["left_out"]:
        lines.append(f"budget spent: {len(v['left_out'])} files not judged")
    for row in v["rows"]:
        if not row["ok"]:
            lines.append(f"  not as expected: {row['file']} ({row['expect']}): {row['why'][:300]}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--subset", default=None,
                        help="comma-separated candidate stems or problem names (globs allowed)")
    parser.add_argument("--out", type=Path, default=Path("out/realsize"))
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop handing out files after this long (builds included); what "
                             "was judged is reported")
    parser.add_argument("--workers", type=int, default=1, help="workers sharing the device")
    parser.add_argument("--timeout-s", type=float, default=600.0,
                        help="EvalOptions.timeout_s for one verdict")
    args = parser.parse_args()
    args.subset = [s.strip() for s in args.subset.split(",") if s.strip()] if args.subset else None
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    result = run(args)
    (args.out / "realsize_bench.json").write_text(json.dumps(result, indent=1))
    text = summary(result)
    print(text)
    (args.out / "realsize_bench.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
