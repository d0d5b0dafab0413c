"""The verdict service, measured as a user meets it: how soon a candidate's code runs, whether honest
kernels are accepted and cheats refused, and how many candidates one device judges per minute.

    python tools/verdict_bench.py --device cuda:0 --out out/verdicts
    python tools/verdict_bench.py --device cuda:0 --out out/verdicts --baseline .baseline

Phases (on one evaluation worker unless --workers says more, sandbox required, stage "full"):

* `ready`: request to candidate code running. The candidate's module reads CLOCK_REALTIME as
  its first statement and raises with it; the clock is the host's (a PID or mount namespace does
  not change it), so stamp minus the moment `run()` was called is the start latency. Measured
  back to back (a spare may still be warming: what a burst of forks sees) and with a pause of
  --pause-s before each request (a warm spare waiting).
* `cost`: what judging costs an honest candidate's speedup. The bundled library's honest
  candidates of --cost-problems (Triton and CUDA on a GPU, C++ and PyTorch on the CPU), each
  judged --cost-repeats times in turn; the figure is each one's median speedup, this tree beside
  --baseline's, measured in the same invocation.
* `corpus`: every candidate of tests/eval (the corpus, the red-team files, the honest files and
  the bundled library) that runs on the device, judged against its `# expect:` header
  (tests/eval/expectations.py). Every honest rejection and every accepted cheat is printed with
  its reason. Candidates per minute is the count over the phase's wall time (the extension
  builds, made first, apart). `--workers 4,6` judges the corpus with 4 workers sharing the device,
  then with 6, one after the other in this process, each set with fresh reference timings;
  `--ext-cache DIR` keeps the builds between invocations.

`--baseline ROOT` runs the same phases on another tree of the code (e.g. `git archive` of an
earlier commit unpacked into ROOT) in a child process, in the same invocation, so that both
columns come from one machine and one hour. Writes verdict_bench.json and verdict_bench.md.
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _import_root(root: Path) -> None:
    sys.path.insert(0, str(root))
    sys.path.insert(1, str(REPO))          # tests.eval.expectations and the corpus stay ours


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# ------------------------------------------------------------------------------------- phases

STAMP_CANDIDATE = (
    "import time\n"
    "raise RuntimeError('STAMP %d STAMP' % time.clock_gettime_ns(time.CLOCK_REALTIME))\n"
    "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    pass\n")


def ready_phase(worker, submission, count: int, pause_s: float) -> dict:
    """Start latencies (s) of `count` candidates, back to back and after a pause each."""
    out = {}
    for label, pause in (("back_to_back", 0.0), ("after_pause", pause_s)):
        latencies = []
        for index in range(count):
            if pause:
                time.sleep(pause)
            sub = submission("softmax", STAMP_CANDIDATE.replace("STAMP %d", f"STAMP{index} %d"))
            began = time.clock_gettime_ns(time.CLOCK_REALTIME)
            verdict = worker.run(sub, "full")
            text = verdict.error or ""
            if f"STAMP{index} " not in text:
                out.setdefault("errors", []).append(text[:300])
                continue
            stamp = int(text.split(f"STAMP{index} ", 1)[1].split(" STAMP", 1)[0])
            latencies.append((stamp - began) / 1e9)
        out[label] = {"n": len(latencies), "p50_s": quantile(latencies, 0.5),
                      "p95_s": quantile(latencies, 0.95), "max_s": max(latencies, default=None)}
    return out


def corpus_files(device: str) -> list[tuple[Path, str, str]]:
    """(path, role "honest"|"cheat", expectation) of every candidate that runs on `device`."""
    from tests.eval.conftest import BUNDLED, CORPUS, HERE, header

    def runs_here(path: Path) -> bool:
        wanted = header(path, "device")
        if device.startswith("cuda"):      # C++-only candidates check for CPU tensors
            return wanted in (None, "cuda", "any") and not path.stem.endswith("_cpp")
        return wanted in (None, "cpu", "any") and not path.stem.endswith("_cuda")

    files = []
    for folder in (CORPUS / "honest", HERE / "honest", BUNDLED / "candidates"):
        files += [(p, "honest", "correct") for p in sorted(folder.glob("*.py")) if runs_here(p)]
    for folder in (CORPUS / "cheat", HERE / "redteam", HERE / "gpu"):
        if folder.name == "gpu" and not device.startswith("cuda"):
            continue
        files += [(p, "cheat", header(p, "expect") or "reject") for p in sorted(folder.glob("*.py"))
                  if runs_here(p)]
    # One problem's candidates one after another: the worker keeps that problem's reference.
    from tests.eval.conftest import candidate_submission
    return sorted(files, key=lambda f: (candidate_submission(f[0]).problem_name, f[0].name))


def cost_files(device: str, problems: list[str]) -> list[Path]:
    from tests.eval.conftest import BUNDLED

    kinds = ("triton", "cuda") if device.startswith("cuda") else ("cpp", "torch")
    return [BUNDLED / "candidates" / f"{p}_{k}.py" for p in problems for k in kinds
            if (BUNDLED / "candidates" / f"{p}_{k}.py").exists()]


def cost_phase(worker, device: str, problems: list[str], repeats: int) -> dict:
    """Median speedup of each honest candidate over `repeats` verdicts, round-robin so that a
    drift of the machine spreads over all of them. Builds happen first, off the figures."""
    from tests.eval.conftest import candidate_submission

    files = cost_files(device, problems)
    with ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) // 2)) as builder:
        list(builder.map(lambda p: worker.build(p.read_text()), files))
    speedups: dict[str, list[float]] = {p.name: [] for p in files}
    times: dict[str, list[dict]] = {p.name: [] for p in files}
    errors: dict[str, str] = {}
    for _ in range(repeats):
        for path in files:
            verdict = worker.run(candidate_submission(path), "full")
            # The times behind each speedup (a clamped one reads as ref == candidate).
            times[path.name].append({**{k: getattr(verdict, k, None) for k in
                                        ("ref_ms", "candidate_ms", "overhead_ms", "spread")},
                                     # where the candidate was charged for slower inputs or
                                     # digest, or the reference's calls between its were lower
                                     "notes": [n for n in getattr(verdict, "notes", None) or []
                                               if "longer than" in n or "timed between" in n]})
            if verdict.correct and verdict.speedup:
                speedups[path.name].append(verdict.speedup)
            else:
                errors[path.name] = (verdict.error or "; ".join(verdict.flags))[:200]
    rows = {name: {"n": len(v), "median": statistics.median(v) if v else None,
                   "min": min(v, default=None), "max": max(v, default=None),
                   "times": times[name]}
            for name, v in speedups.items()}
    print(json.dumps(rows), flush=True)
    return {"rows": rows, "errors": errors}


def corpus_phase(workers: list, device: str, limit: int | None, budget_s: float | None) -> dict:
    """Every corpus file judged once against its expectation. Extensions are built first, on
    CPU threads, as a node builds queued candidates while its device judges others: the build
    time is reported apart, and the per-minute figure counts judging only (and, apart, with
    the builds). With several workers (sharing the device, taking turns to time it) each free
    worker takes the next file, as the scheduler hands a free worker the next request; the files
    are queued problem by problem, so consecutive ones often find their problem's reference in
    the worker. (Handing a worker a whole problem's files at once left the largest group, 40 of
    the 133 files, to one worker while the others idled.)"""
    from tests.eval.conftest import candidate_submission
    from tests.eval.expectations import meets

    files = corpus_files(device)[:limit] if limit else corpus_files(device)
    sources = [p.read_text() for p, _, _ in files]
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) // 2)) as builder:
        list(builder.map(workers[0].build,
                         [t for t in sources if "load_inline" in t or "cpp_extension" in t]))
    build_wall = time.monotonic() - began
    groups: dict[str, list] = {}
    for entry in files:
        try:
            name = candidate_submission(entry[0]).problem_name
        except Exception:  # noqa: BLE001 - reported as a row below
            name = ""
        groups.setdefault(name, []).append(entry)
    queue = [entry for group in groups.values() for entry in group]
    lock = threading.Lock()
    rows: list[dict] = []
    began = time.monotonic()

    def judge_all(worker) -> None:
        while True:
            with lock:
                if not queue:
                    return
                path, role, expect = queue.pop(0)
            if budget_s and time.monotonic() - began > budget_s:
                return
            try:
                sub = candidate_submission(path)
            except Exception as exc:  # noqa: BLE001 - a file this tree's loader refuses
                with lock:
                    rows.append({"file": f"{path.parent.name}/{path.name}", "role": role,
                                 "ok": False, "why": f"not submitted: {exc}", "wall_s": 0.0})
                continue
            start = time.monotonic()
            verdict = worker.run(sub, "full")
            wall = time.monotonic() - start
            ok, why = meets(verdict, expect)
            row = {"file": f"{path.parent.name}/{path.name}", "role": role, "expect": expect,
                   "ok": ok, "why": why, "correct": verdict.correct,
                   "speedup": verdict.speedup, "ref_ms": verdict.ref_ms,
                   "candidate_ms": verdict.candidate_ms, "notes": verdict.notes[:3],
                   "error": (verdict.error or "")[:300],
                   "flags": verdict.flags[:3], "wall_s": round(wall, 3),
                   "stage_s": verdict.stage_seconds}
            with lock:
                rows.append(row)
            print(f"  {'ok ' if ok else 'MISS'} {row['file']:60} {wall:6.2f} s "
                  f"{'' if ok else why[:160]}", flush=True)

    with ThreadPoolExecutor(max_workers=len(workers)) as pool:
        list(pool.map(judge_all, workers))
    total = time.monotonic() - began
    if len(rows) < len(files):
        print(f"  budget of {budget_s:.0f} s spent: {len(files) - len(rows)} files left out")
    honest = [r for r in rows if r["role"] == "honest"]
    cheats = [r for r in rows if r["role"] == "cheat"]
    walls = [r["wall_s"] for r in rows if r["wall_s"]]
    stages: dict[str, float] = {}
    for r in rows:
        for key, value in (r.get("stage_s") or {}).items():
            stages[key] = stages.get(key, 0.0) + value
    return {"rows": rows, "wall_s": round(total, 1), "files": len(files), "workers": len(workers),
            "build_wall_s": round(build_wall, 1),
            "honest": len(honest), "honest_rejected": sum(not r["ok"] for r in honest),
            "cheats": len(cheats), "cheats_missed": sum(not r["ok"] for r in cheats),
            "cheats_accepted": sum(bool(r.get("correct")) and not r["ok"] for r in cheats),
            "per_minute": round(60 * len(rows) / total, 1) if total else None,
            "per_minute_with_builds": round(60 * len(rows) / (total + build_wall), 1),
            "stage_s_total": {k: round(v, 1) for k, v in sorted(stages.items())},
            "verdict_p50_s": quantile(walls, 0.5), "verdict_p95_s": quantile(walls, 0.95)}


def measure(args: argparse.Namespace) -> dict:
    """Both phases on this process's import of specgen."""
    import specgen
    from specgen.eval import EvalOptions, EvalWorker
    from tests.eval.conftest import submission

    work = Path(tempfile.mkdtemp(prefix="specgen-verdict-bench-"))
    result: dict = {"code": str(Path(specgen.__file__).resolve().parents[1]), "device": args.device}

    def start(count: int, cache: Path) -> tuple[EvalOptions, list]:
        """`count` workers sharing the device, with a cache of their own (the reference's
        timings start uncached), its extension builds copied in from --ext-cache or an earlier
        set: builds are reported apart, so a set need not repeat them."""
        if args.ext_cache is not None and args.ext_cache.is_dir():
            shutil.copytree(args.ext_cache, cache / "ext", symlinks=True, dirs_exist_ok=True)
        options = EvalOptions(timeout_s=args.timeout_s, cache_dir=str(cache))
        sharing = {}
        # An earlier tree run with --baseline may predate `gpu_sharers` (its requests did not
        # give way to a timing); it is then started as it was.
        if "gpu_sharers" in inspect.signature(EvalWorker).parameters:
            sharing["gpu_sharers"] = count if args.device.startswith("cuda") else 1
        return options, [EvalWorker(args.device, work / f"w{count}-{i}", spare_processes=1,
                                    options=options, **sharing) for i in range(count)]

    began = time.monotonic()
    counts = args.workers
    options, workers = start(counts[0], work / "cache")
    with contextlib.ExitStack() as stack:
        for w in workers:
            stack.enter_context(w)
        worker = workers[0]
        result["sandbox"] = worker.sandbox_status.detail
        result["start_s"] = round(time.monotonic() - began, 2)
        if "ready" in args.phases:
            print(f"ready ({result['code']}):", flush=True)
            result["ready"] = ready_phase(worker, submission, args.ready, args.pause_s)
            print(json.dumps(result["ready"]), flush=True)
        if "cost" in args.phases:
            print(f"cost ({result['code']}):", flush=True)
            result["cost"] = cost_phase(worker, args.device, args.cost_problems.split(","),
                                        args.cost_repeats)
        if "corpus" in args.phases:
            print(f"corpus ({result['code']}, {counts[0]} worker(s)):", flush=True)
            result["corpus"] = corpus_phase(workers, args.device, args.limit, args.budget_s)
            if args.ext_cache is not None and (Path(options.cache_dir) / "ext").is_dir():
                shutil.copytree(Path(options.cache_dir) / "ext", args.ext_cache, symlinks=True,
                                dirs_exist_ok=True)
        ready = worker.ready_info
        result["device_name"] = ready.device_name if ready is not None else None
    # Further worker counts, one after the other in this process: the same files and builds,
    # fresh workers and reference timings, so the counts compare side by side.
    result["more_corpora"] = []
    for count in counts[1:] if "corpus" in args.phases else []:
        args.ext_cache = args.ext_cache or Path(options.cache_dir) / "ext"
        began = time.monotonic()
        _, more = start(count, work / f"cache-{count}")
        with contextlib.ExitStack() as stack:
            for w in more:
                stack.enter_context(w)
            started = round(time.monotonic() - began, 2)
            print(f"corpus ({result['code']}, {count} worker(s)):", flush=True)
            corpus = corpus_phase(more, args.device, args.limit, args.budget_s)
            result["more_corpora"].append({**corpus, "start_s": started})
    if "cost" in args.phases and args.device.startswith("cuda") and args.json is None:
        # The same candidates timed in a process of their own, three ways (tools/call_times.py):
        # how the judge's time of a call relates to the GPU's, for this tree's verdicts.
        files = [str(p) for p in cost_files(args.device, args.cost_problems.split(","))]
        done = subprocess.run([sys.executable, str(REPO / "tools" / "call_times.py"), "--device",
                               args.device, "--cache-dir", str(options.cache_dir), *files],
                              capture_output=True, text=True, cwd=REPO)
        result["call_times"] = (json.loads(done.stdout) if done.returncode == 0 else
                                {"error": done.stderr[-500:]})
        print("call times:", json.dumps(result["call_times"]), flush=True)
    return result


# ------------------------------------------------------------------------------------- report

def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(results: dict[str, dict], args: argparse.Namespace) -> str:
    # The device as its runners saw it (the GPU's or CPU's name), not only as it was asked for.
    seen = sorted({r.get("device_name") or "?" for r in results.values()})
    lines = [f"# verdict bench, {time.strftime('%Y-%m-%d')}, device {args.device} "
             f"({', '.join(seen)}), {'/'.join(map(str, args.workers))} worker(s) in the corpus phase",
             ""]
    names = list(results)
    lines += ["| figure | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]

    def row(label: str, get) -> None:
        cells = []
        for name in names:
            try:
                cells.append(get(results[name]))
            except (KeyError, TypeError):
                cells.append("-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("worker start (s)", lambda r: _fmt(r["start_s"]))
    for label in ("back_to_back", "after_pause"):
        row(f"runner ready p50 / p95, {label} (s)",
            lambda r, k=label: f"{_fmt(r['ready'][k]['p50_s'])} / {_fmt(r['ready'][k]['p95_s'])}")
    row("corpus files judged", lambda r: f"{len(r['corpus']['rows'])} of {r['corpus']['files']}")
    row("honest rejected", lambda r: f"{r['corpus']['honest_rejected']} of {r['corpus']['honest']}")
    row("cheats accepted", lambda r: f"{r['corpus']['cheats_accepted']} of {r['corpus']['cheats']}")
    row("cheats not meeting their expectation",
        lambda r: f"{r['corpus']['cheats_missed']} of {r['corpus']['cheats']}")
    row("verdict wall p50 / p95 (s)",
        lambda r: f"{_fmt(r['corpus']['verdict_p50_s'])} / {_fmt(r['corpus']['verdict_p95_s'])}")
    row("extension builds ahead, wall (s)", lambda r: _fmt(r["corpus"]["build_wall_s"], 1))
    row("workers on the device", lambda r: str(r["corpus"].get("workers", 1)))
    row("candidates per minute, judging", lambda r: _fmt(r["corpus"]["per_minute"], 1))
    row("candidates per minute, with the builds",
        lambda r: _fmt(r["corpus"].get("per_minute_with_builds"), 1))
    row("busiest stages, summed (s)", lambda r: ", ".join(
        f"{k} {v:.0f}" for k, v in sorted(r["corpus"]["stage_s_total"].items(),
                                          key=lambda kv: -kv[1])
        if k not in ("total", "judge")))
    costs = [r.get("cost") for r in results.values()]
    if costs[0]:
        lines += ["", "## honest speedups (median of repeats; min-max)", "",
                  "| candidate | " + " | ".join(names) + " | ratio |",
                  "|---|" + "---|" * (len(names) + 1)]
        for name, row in costs[0]["rows"].items():
            cells = []
            for cost in costs:
                r = (cost or {}).get("rows", {}).get(name)
                cells.append("-" if not r or r["median"] is None else
                             f"{r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f}, n={r['n']})")
            other = (costs[-1] or {}).get("rows", {}).get(name) if len(costs) > 1 else None
            ratio = (f"{row['median'] / other['median']:.3f}" if other and other["median"]
                     and row["median"] else "-")
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {ratio} |")
        for label, cost in zip(names, costs):
            for name, error in (cost or {}).get("errors", {}).items():
                lines.append(f"- {label}, `{name}` not measured every time: {error}")
        times = results[names[0]].get("call_times")
        if times:
            lines += ["", "## one call, in a process of its own (tools/call_times.py), ms", "",
                      "| program | judge (median of verdicts) | device | events | latency |",
                      "|---|---|---|---|---|"]
            for name, t in times.items():
                if "error" in t or name == "error":
                    lines.append(f"| {name} | {t if name == 'error' else t['error']} | | | |")
                    continue
                judged = [x.get("candidate_ms") for x in costs[0]["rows"].get(name, {}).get("times", [])
                          if x.get("candidate_ms")]
                refs = [x.get("ref_ms") for x in costs[0]["rows"].get(name, {}).get("times", [])
                        if x.get("ref_ms")]
                for who, judged_ms in (("candidate", judged), ("reference", refs)):
                    c = t[who]
                    lines.append(f"| {name} ({who}) | {_fmt(statistics.median(judged_ms) if judged_ms else None, 4)}"
                                 f" | {c['device_ms']:.4f} | {c['events_ms']:.4f} | {c['latency_ms']:.4f} |")
    for name in names:
        corpus = results[name].get("corpus")
        if not corpus:
            continue
        misses = [r for r in corpus["rows"] if not r["ok"]]
        lines += ["", f"## {name}: {len(misses)} not as expected", ""]
        lines += [f"- `{r['file']}` ({r['role']}): {r['why'][:300]}" for r in misses]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--phases", default="ready,corpus")
    parser.add_argument("--ready", type=int, default=30, help="candidates per ready series")
    parser.add_argument("--pause-s", type=float, default=1.0)
    parser.add_argument("--workers", default="1",
                        help="corpus: workers sharing the device; several counts, "
                             "comma-separated, are judged one after the other (--baseline: the "
                             "first count)")
    parser.add_argument("--ext-cache", type=Path, default=None,
                        help="extension builds kept here between invocations (copied in before "
                             "the corpus, back after it)")
    parser.add_argument("--cost-problems", default="fused_elementwise,layernorm,softmax")
    parser.add_argument("--cost-repeats", type=int, default=3)
    parser.add_argument("--limit", type=int, default=None, help="at most this many corpus files")
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop the corpus phase after this long (what was judged is reported)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another tree of the code, measured the same way in a child process")
    parser.add_argument("--baseline-phases", default=None)
    parser.add_argument("--baseline-ready", type=int, default=None,
                        help="candidates per ready series for the baseline (default: --ready)")
    parser.add_argument("--root", type=Path, default=REPO, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path("out/verdicts"))
    args = parser.parse_args()
    args.phases = args.phases.split(",")
    args.workers = [int(n) for n in str(args.workers).split(",")]
    _import_root(args.root.resolve())
    if args.json is not None:                       # the child of a --baseline run
        args.json.resolve().write_text(json.dumps(measure(args)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    measured = measure(args)
    more = measured.pop("more_corpora", [])
    # One column per worker count when there are several.
    label = f"this tree, {args.workers[0]} workers" if more else "this tree"
    results = {label: measured}
    for corpus in more:
        results[f"this tree, {corpus['workers']} workers"] = {**measured, "corpus": corpus,
                                                              "start_s": corpus["start_s"]}
    # Written now as well: a baseline cut short by a time limit leaves this tree's figures.
    (args.out / "verdict_bench.json").write_text(json.dumps(results, indent=1))
    if args.baseline is not None:
        child_json = args.out / "baseline.json"
        command = [sys.executable, __file__, "--device", args.device,
                   "--root", str(args.baseline.resolve()),
                   "--phases", args.baseline_phases or ",".join(args.phases),
                   "--ready", str(args.baseline_ready or args.ready), "--pause-s", str(args.pause_s),
                   "--timeout-s", str(args.timeout_s), "--cost-problems", args.cost_problems,
                   "--cost-repeats", str(args.cost_repeats), "--json", str(child_json.resolve())]
        # The corpus with as many workers as this tree's first count, on the same builds.
        command += ["--workers", str(args.workers[0])]
        if args.ext_cache is not None:
            command += ["--ext-cache", str(args.ext_cache.resolve())]
        if args.limit:
            command += ["--limit", str(args.limit)]
        if args.budget_s:
            command += ["--budget-s", str(args.budget_s)]
        env = {**os.environ, "PYTHONPATH": str(args.baseline.resolve())}
        done = subprocess.run(command, env=env, cwd=args.baseline.resolve())
        if done.returncode == 0 and child_json.exists():
            results[f"baseline ({args.baseline.name})"] = json.loads(child_json.read_text())
        else:
            print(f"baseline failed (exit {done.returncode})")
    (args.out / "verdict_bench.json").write_text(json.dumps(results, indent=1))
    text = report(results, args)
    (args.out / "verdict_bench.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
