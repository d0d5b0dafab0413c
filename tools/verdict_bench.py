"""The verdict service, measured as a user meets it: how soon a candidate's code runs, whether honest
kernels are accepted and cheats refused, and how many candidates one device judges per minute.

    python tools/verdict_bench.py --device cuda:0 --out out/verdicts
    python tools/verdict_bench.py --device cuda:0 --out out/verdicts --baseline .baseline

Phases (each on one evaluation worker, sandbox required, stage "full"):

* `ready`: request to candidate code running. The candidate's module reads CLOCK_REALTIME as
  its first statement and raises with it; the clock is the host's (a PID or mount namespace does
  not change it), so stamp minus the moment `run()` was called is the start latency. Measured
  back to back (a spare may still be warming: what a burst of forks sees) and with a pause of
  --pause-s before each request (a warm spare waiting).
* `corpus`: every candidate of tests/eval (the corpus, the red-team files, the honest files and
  the bundled library) that runs on the device, judged against its `# expect:` header
  (tests/eval/expectations.py). Every honest rejection and every accepted cheat is printed with
  its reason. Candidates per minute is the count over the phase's wall time, one worker.

`--baseline ROOT` runs the same phases on another tree of the code (e.g. `git archive` of an
earlier commit unpacked into ROOT) in a child process, in the same invocation, so that both
columns come from one machine and one hour. Writes verdict_bench.json and verdict_bench.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
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


def corpus_phase(worker, device: str, limit: int | None, budget_s: float | None) -> dict:
    from tests.eval.conftest import candidate_submission
    from tests.eval.expectations import meets

    files = corpus_files(device)[:limit] if limit else corpus_files(device)
    # Extensions build on CPU threads from the start, as a node builds queued candidates while its
    # device judges others; a run that needs one waits for it.
    builder = ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) // 2))
    builds = [builder.submit(worker.build, path.read_text()) for path, _, _ in files
              if "load_inline" in path.read_text() or "cpp_extension" in path.read_text()]
    rows = []
    began = time.monotonic()
    for path, role, expect in files:
        if budget_s and time.monotonic() - began > budget_s:
            print(f"  budget of {budget_s:.0f} s spent: {len(files) - len(rows)} files left out")
            break
        try:
            sub = candidate_submission(path)
        except Exception as exc:  # noqa: BLE001 - a file this tree's loader refuses
            rows.append({"file": f"{path.parent.name}/{path.name}", "role": role, "ok": False,
                         "why": f"not submitted: {exc}", "wall_s": 0.0})
            continue
        start = time.monotonic()
        verdict = worker.run(sub, "full")
        wall = time.monotonic() - start
        ok, why = meets(verdict, expect)
        rows.append({"file": f"{path.parent.name}/{path.name}", "role": role, "expect": expect,
                     "ok": ok, "why": why, "correct": verdict.correct, "speedup": verdict.speedup,
                     "error": (verdict.error or "")[:300], "flags": verdict.flags[:3],
                     "wall_s": round(wall, 3)})
        print(f"  {'ok ' if ok else 'MISS'} {rows[-1]['file']:60} {wall:6.2f} s "
              f"{'' if ok else why[:160]}", flush=True)
    total = time.monotonic() - began
    for build in builds:
        build.cancel()
    builder.shutdown(wait=False)
    honest = [r for r in rows if r["role"] == "honest"]
    cheats = [r for r in rows if r["role"] == "cheat"]
    walls = [r["wall_s"] for r in rows if r["wall_s"]]
    return {"rows": rows, "wall_s": round(total, 1), "files": len(files),
            "honest": len(honest), "honest_rejected": sum(not r["ok"] for r in honest),
            "cheats": len(cheats), "cheats_missed": sum(not r["ok"] for r in cheats),
            "cheats_accepted": sum(bool(r.get("correct")) and not r["ok"] for r in cheats),
            "per_minute": round(60 * len(rows) / total, 1) if total else None,
            "verdict_p50_s": quantile(walls, 0.5), "verdict_p95_s": quantile(walls, 0.95)}


def measure(args: argparse.Namespace) -> dict:
    """Both phases on this process's import of specgen."""
    import specgen
    from specgen.eval import EvalOptions, EvalWorker
    from tests.eval.conftest import submission

    work = Path(tempfile.mkdtemp(prefix="specgen-verdict-bench-"))
    options = EvalOptions(timeout_s=args.timeout_s, cache_dir=str(work / "cache"))
    result: dict = {"code": str(Path(specgen.__file__).resolve().parents[1]), "device": args.device}
    began = time.monotonic()
    with EvalWorker(args.device, work / "w", spare_processes=1, options=options) as worker:
        result["sandbox"] = worker.sandbox_status.detail
        result["start_s"] = round(time.monotonic() - began, 2)
        if "ready" in args.phases:
            print(f"ready ({result['code']}):", flush=True)
            result["ready"] = ready_phase(worker, submission, args.ready, args.pause_s)
            print(json.dumps(result["ready"]), flush=True)
        if "corpus" in args.phases:
            print(f"corpus ({result['code']}):", flush=True)
            result["corpus"] = corpus_phase(worker, args.device, args.limit, args.budget_s)
    return result


# ------------------------------------------------------------------------------------- report

def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(results: dict[str, dict], args: argparse.Namespace) -> str:
    lines = [f"# verdict bench, {time.strftime('%Y-%m-%d')}, device {args.device}", ""]
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
    row("candidates per minute, one worker", lambda r: _fmt(r["corpus"]["per_minute"], 1))
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
    _import_root(args.root.resolve())
    if args.json is not None:                       # the child of a --baseline run
        args.json.resolve().write_text(json.dumps(measure(args)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"this tree": measure(args)}
    if args.baseline is not None:
        child_json = args.out / "baseline.json"
        command = [sys.executable, __file__, "--device", args.device,
                   "--root", str(args.baseline.resolve()),
                   "--phases", args.baseline_phases or ",".join(args.phases),
                   "--ready", str(args.baseline_ready or args.ready), "--pause-s", str(args.pause_s),
                   "--timeout-s", str(args.timeout_s), "--json", str(child_json.resolve())]
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
