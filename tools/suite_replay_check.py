#!/usr/bin/env python3
"""A live suite against its replay by `specgen bench`: end-to-end time per mode and problem.

    python tools/suite_replay_check.py                          # layernorm, softmax; speed 20
    python tools/suite_replay_check.py --problems layernorm,softmax,mlp_gelu --concurrency 2 \
        --speed 20 --out /tmp/suite-replay --wall

Checks issue 51's target: a suite's replay by `specgen bench` gives each mode's end-to-end times
within 10% of the live suite's on the same problems (the virtual clock checked against the live
run). In one invocation:

1. **Served traces** (`OUT/served/`): per problem its bundled trace (`specgen/data/traces/`, or the
   generated one in `generated/`), else one generated turn of `traces/synthetic.py` (seed 0, C++
   candidates, as `tools/make_traces.py --generated` makes the bundled one), so every kernel runs
   natively on a CPU. They are served by `specgen trace serve --pace recorded --speed S` on a free
   port (`--port 0`).
2. **Live suite** (`OUT/live/`): `specgen optimize PROBLEMS --llm openai --base-url ... --modes M
   --concurrency N --devices D --max-iterations T` against that server: every job's reasoning
   and forks over HTTP, its candidates on the suite's local clusters, its turns recorded to
   `OUT/live/traces/MODE/PROBLEM.trace.json`, its end-to-end time in `OUT/live/results.json`.
3. **Replay** (`OUT/bench-virtual/`, with `--wall` also `OUT/bench-wall/`): `specgen bench` on the
   sequential mode's recorded traces (a specgen-mode trace stops where early termination cut
   its reasoning; the baselines' hold every turn whole), same modes, concurrency, devices and
   speed.
4. **Table**: per mode and problem the live and replayed end-to-end seconds, (replay - live) /
   live and whether it is within 10%, the median per mode; printed and written to
   `OUT/suite_replay_check.json`, with a breakdown per job (reasoning, the wait after it, the
   evaluations' service times) to tell where a difference lies.

**One pace on both sides.** `specgen trace serve --pace recorded --speed S` sends each token at
its recorded time / S. A bundled or generated trace is recorded in the piece vocabulary at a
stated rate (56 pieces/s for generated ones); the server re-tokenizes it with the client's
tokenizer, each token due when its last character was, so the served rate in the client's tokens
is S x R, R = the trace's client tokens / its recorded decode seconds. The suite records those
client tokens, and `specgen bench --speed S` paces a recorded turn by its token ids at the timing
model's `decode_tps` x S (r1 tokens/s per sequence up to the knee). The two agree when r1 = R, so
the bench is given `--timing r1=R`, R measured here from the served traces (client tokens of
every reasoning and answer over their recorded seconds, the first token's wait left out, since the
timing model counts it as prefill). The traces' own R differ a little (their text's tokens per
piece); each trace's R and the reasoning seconds the single r1 gives it are in the JSON, so that
error is in view. The recorded traces' own rate (their client tokens over their recorded seconds,
times S) shows whether the server kept the pace on the machine.

Nothing is fitted to the live run: the traces, R, the speed and the bench's settings are fixed
before it starts.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specgen.traces.bundled import (TRACE_SUFFIX, bundled_problem, bundled_trace,  # noqa: E402
                                    generated_trace_path)
from specgen.traces.format import Trace  # noqa: E402

TARGET = 0.10
DEFAULT_TOKENIZER = Path.home() / ".cache" / "specgen" / "tiny-qwen2-v1"
MODEL = "specgen-trace"


def specgen_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "specgen.cli", *args]


def say(text: str) -> None:
    print(text, flush=True)


# -- 1. the served traces and their rate ---------------------------------------------------------


def served_traces(problems: list[str], turns: int, folder: Path) -> list[Path]:
    """Per problem its bundled trace, else one generated (seed 0, C++ candidates), in `folder`."""
    from specgen.traces.synthetic import generate_traces

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in problems:
        bundled_problem(name)     # an unknown problem is an error naming the bundled ones
        found = bundled_trace(name) or generated_trace_path(name)
        target = folder / f"{name}{TRACE_SUFFIX}"
        if found.is_file():
            target.write_text(found.read_text())
        else:
            (trace,), _ = generate_traces([name], turns=turns, seed=0, langs=("cpp",))
            trace.save(target)
        paths.append(target)
    return paths


def client_rate(paths: list[Path], tokenizer: Path) -> dict[str, Any]:
    """R: the served traces' client tokens per recorded decode second (module docstring)."""
    from specgen.engines.tokenizer_loading import HFTokenizer

    tok = HFTokenizer(str(tokenizer), engine_name="suite_replay_check")
    per_trace, tokens_all, seconds_all = {}, 0, 0.0
    for path in paths:
        trace = Trace.load(path)
        tokens, seconds = 0, 0.0
        for it in trace.iterations:
            first = it.reasoning.chunks[0].t if it.reasoning.chunks else 0.0
            end = (it.final.chunks[-1].t if it.final.chunks else it.reasoning.duration_s)
            tokens += len(tok.encode(it.reasoning.text)) + len(tok.encode(it.final.text))
            seconds += end - first
        per_trace[trace.metadata.problem] = {"client_tokens": tokens, "decode_s": seconds,
                                             "rate": tokens / seconds if seconds else None}
        tokens_all += tokens
        seconds_all += seconds
    return {"r1": tokens_all / seconds_all, "per_trace": per_trace}


# -- 2. the server and the live suite --------------------------------------------------------------


def start_server(paths: list[Path], args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen, str]:
    cmd = specgen_cmd("trace", "serve", *map(str, paths), "--port", "0", "--tokenizer",
                      str(args.tokenizer), "--pace", "recorded", "--speed", f"{args.speed:g}",
                      "--model", MODEL, "--quiet")
    say("$ " + " ".join(cmd[2:]))
    with open(log, "wb") as err:
        process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, start_new_session=True,
                                   env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert process.stdout is not None
    deadline = time.monotonic() + 180
    line = b""
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
        byte = os.read(process.stdout.fileno(), 1) if ready else b""
        if not byte:
            stop_server(process)
            raise SystemExit(f"trace serve did not start:\n{log.read_text(errors='replace')[-3000:]}")
        line += byte
    words = line.decode()
    say(words.rstrip())
    url = words.split(" at ", 1)[1].split(" ", 1)[0].rstrip("/")
    return process, url if url.endswith("/v1") else url + "/v1"


def stop_server(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def run(cmd: list[str], log: Path) -> float:
    say("$ " + " ".join(cmd[2:] if cmd[:2] == [sys.executable, "-m"] else cmd))
    began = time.monotonic()
    with open(log, "wb") as out:
        code = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT,
                               env=dict(os.environ, HF_HUB_OFFLINE="1"))
    took = time.monotonic() - began
    if code != 0:
        raise SystemExit(f"exit {code} after {took:.0f} s; its output:\n"
                         f"{log.read_text(errors='replace')[-4000:]}")
    say(f"  done in {took:.0f} s (output in {log})")
    return took


# -- 4. the comparison -----------------------------------------------------------------------------


def live_breakdown(live: Path, row: dict[str, Any]) -> dict[str, Any]:
    """A live job's time split: reasoning streams, the wait after the last one, evaluations."""
    data = json.loads((live / row["folder"] / "result.json").read_text())
    t0, end = data["started_at"], data["finished_at"]
    streams = data.get("reasoning") or []
    reasoning_end = max((s.get("finished_at") or end for s in streams), default=t0)
    first = min((s["started_at"] for s in streams), default=t0)
    evals = []
    for c in data.get("candidates") or []:
        for stage in ("validation", "profile"):
            u = c.get(stage)
            if not u or not u.get("started_at"):
                continue
            evals.append({"candidate": c["candidate_id"], "origin": c["origin"],
                          "stage": u.get("stage"), "worker": u.get("worker"),
                          "queued_s": round(u["started_at"] - c["extracted_at"], 3)
                          if stage == "validation" else None,
                          "service_s": round(u["finished_at"] - u["started_at"], 3),
                          "stage_seconds": (u.get("verdict") or {}).get("stage_seconds")})
    return {"end_to_end_s": end - t0, "before_reasoning_s": first - t0,
            "reasoning_s": reasoning_end - first, "after_reasoning_s": end - reasoning_end,
            "reasoning_tokens": data["metrics"]["reasoning_tokens"],
            "forks": data["metrics"]["forks"], "candidates": data["metrics"]["candidates"],
            "evaluations": evals}


def recorded_rate(path: Path, speed: float) -> float | None:
    """The recorded trace's client tokens per recorded decode second / speed: the served pace as
    the client saw it, at speed 1 (R when the server kept the pace)."""
    trace = Trace.load(path)
    tokens, seconds = 0, 0.0
    for it in trace.iterations:
        if not it.reasoning.chunks:
            continue
        tokens += it.reasoning.num_tokens + it.final.num_tokens
        end = it.final.chunks[-1].t if it.final.chunks else it.reasoning.duration_s
        seconds += end - it.reasoning.chunks[0].t
    return tokens / seconds / speed if seconds else None


def compare(live: Path, bench: Path, clock: str) -> dict[str, Any]:
    results = json.loads((live / "results.json").read_text())
    replay = json.loads((bench / "results.json").read_text())
    if clock == "virtual":
        replayed = {(j["mode"], j["problem"]): j["end_to_end_s"] for j in replay["jobs"]}
    else:
        replayed = {(j["mode"], j["problem"]): j["end_to_end_s"] for j in _wall_jobs(replay)}
    rows = []
    for job in results["jobs"]:
        key = (job["mode"], job["problem"])
        lv, rp = job["end_to_end_s"], replayed.get(key)
        diff = None if rp is None or not lv else (rp - lv) / lv
        rows.append({"mode": job["mode"], "problem": job["problem"], "live_s": lv, "replay_s": rp,
                     "diff": diff, "within": diff is not None and abs(diff) <= TARGET,
                     "live_status": job["status"]})
    medians = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        diffs = [r["diff"] for r in rows if r["mode"] == mode and r["diff"] is not None]
        medians[mode] = {"live_s": statistics.median(r["live_s"] for r in rows if r["mode"] == mode),
                         "replay_s": statistics.median(r["replay_s"] for r in rows
                                                       if r["mode"] == mode and r["replay_s"] is not None),
                         "diff": statistics.median(diffs) if diffs else None,
                         "within": bool(diffs) and abs(statistics.median(diffs)) <= TARGET,
                         "all_within": bool(diffs) and all(abs(d) <= TARGET for d in diffs)}
    return {"clock": clock, "rows": rows, "medians": medians}


def _wall_jobs(replay: dict[str, Any]) -> list[dict[str, Any]]:
    jobs = []
    for j in replay.get("jobs") or []:
        e2e = j.get("end_to_end_s")
        if e2e is None:
            e2e = (j.get("metrics") or {}).get("end_to_end_s")
        jobs.append({"mode": j.get("mode"), "problem": j.get("problem"), "end_to_end_s": e2e})
    return jobs


def table(result: dict[str, Any]) -> str:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:+.1%}"

    def sec(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    lines = [f"replay clock: {result['clock']}",
             "| mode | problem | live s | replayed s | (replay - live) / live | within 10% |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        lines.append(f"| {r['mode']} | {r['problem']} | {sec(r['live_s'])} | {sec(r['replay_s'])} | "
                     f"{pct(r['diff'])} | {'yes' if r['within'] else 'no'} |")
    for mode, m in result["medians"].items():
        lines.append(f"| {mode} | median | {sec(m['live_s'])} | {sec(m['replay_s'])} | "
                     f"{pct(m['diff'])} | {'yes' if m['within'] else 'no'} (every problem: "
                     f"{'yes' if m['all_within'] else 'no'}) |")
    return "\n".join(lines)


def split(live_jobs: dict[str, Any], virtual: dict[str, Any], recorded: list[Path]) -> list[dict[str, Any]]:
    """Per job where the live and the replayed time go: the live job's start (job start to its
    first reasoning request), its reasoning and answer streamed, the time after them (the answer's
    evaluation, and whatever else the job waited for) and its build seconds; the replay's reasoning
    and answer at r1 x speed, the rest of its end-to-end time, and the build seconds the bench
    measured for the programs the job evaluated."""
    finals = {Trace.load(p).metadata.problem: sum(it.final.num_tokens for it in Trace.load(p).iterations)
              for p in recorded}
    builds: dict[str, float] = {}
    for row in virtual["programs"]:
        builds[row["problem"]] = builds.get(row["problem"], 0.0) + (row.get("build_s") or 0.0)
    out = []
    for key, lv in live_jobs.items():
        vj = virtual["jobs"].get(key)
        mode, problem = key.split("/", 1)
        if vj is None:
            continue
        read = vj["reasoning_read_tokens"] or vj["reasoning_tokens"] or 0
        whole = read >= (vj["reasoning_tokens"] or 0)
        modelled = (read + (finals.get(problem, 0) if whole else 0)) / virtual["tokens_per_s"]
        out.append({"job": key, "live_start_s": lv["before_reasoning_s"],
                    "live_reasoning_s": lv["reasoning_s"], "replay_reasoning_s": modelled,
                    "live_after_s": lv["after_reasoning_s"],
                    "replay_after_s": vj["end_to_end_s"] - modelled,
                    "live_build_s": sum((e.get("stage_seconds") or {}).get("build", 0.0)
                                        for e in lv["evaluations"]),
                    "bench_build_s": builds.get(problem, 0.0)})
    return out


def split_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| job | live: start s | reasoning s (live / replay) | after the reasoning s (live / replay) "
             "| build s (live job / bench, the problem's programs) |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['job']} | {r['live_start_s']:.1f} | {r['live_reasoning_s']:.1f} / "
                     f"{r['replay_reasoning_s']:.1f} | {r['live_after_s']:.1f} / {r['replay_after_s']:.1f} "
                     f"| {r['live_build_s']:.1f} / {r['bench_build_s']:.1f} |")
    return "\n".join(lines)


def virtual_breakdown(bench: Path, r1: float, speed: float) -> dict[str, Any]:
    """Per simulated job its reasoning tokens and their modelled seconds; per measured program its
    build, validation and profile seconds."""
    data = json.loads((bench / "results.json").read_text())
    jobs = {f"{j['mode']}/{j['problem']}": {
        "end_to_end_s": j["end_to_end_s"], "reasoning_tokens": j.get("reasoning_tokens"),
        "reasoning_read_tokens": j.get("reasoning_read_tokens"),
        "candidates": j.get("candidates"), "validated": j.get("validated"), "profiled": j.get("profiled")}
        for j in data["jobs"]}
    for j in jobs.values():
        read = j["reasoning_read_tokens"] or j["reasoning_tokens"]
        j["reasoning_s_at_r1"] = read / (r1 * speed) if read else None
    programs = [{k: r.get(k) for k in ("problem", "program", "final", "device", "build_s", "validate_s",
                                       "profile_s", "correct", "speedup")}
                for r in data.get("evaluations") or []]
    return {"jobs": jobs, "programs": programs, "tokens_per_s": r1 * speed}


# -- main ------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default="layernorm,softmax",
                        help="bundled problems, comma-separated (default layernorm,softmax)")
    parser.add_argument("--modes", default="specgen,sequential")
    parser.add_argument("--speed", type=float, default=20.0,
                        help="the served pace and the bench's --speed (default 20)")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--devices", default="cpu,cpu")
    parser.add_argument("--max-iterations", type=int, default=1,
                        help="turns per job; generated traces get this many turns (default 1)")
    parser.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER,
                        help=f"the client's Hugging Face tokenizer (default {DEFAULT_TOKENIZER})")
    parser.add_argument("--wall", action="store_true", help="also replay on the wall clock")
    parser.add_argument("--out", type=Path, default=Path("specgen-runs/suite-replay-check"))
    parser.add_argument("--compare-only", action="store_true",
                        help="read the folders an earlier run of this tool left in --out")
    args = parser.parse_args()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    problems = [p.strip() for p in args.problems.split(",") if p.strip()]
    clocks = ["virtual"] + (["wall"] if args.wall else [])
    began = time.monotonic()
    commands: dict[str, list[str]] = {}

    paths = served_traces(problems, args.max_iterations, out / "served") if not args.compare_only \
        else sorted((out / "served").glob(f"*{TRACE_SUFFIX}"))
    rate = client_rate(paths, args.tokenizer)
    r1 = rate["r1"]
    say(f"served traces: {', '.join(p.name for p in paths)}; client tokens per recorded second "
        f"R = {r1:.2f} (" + ", ".join(f"{k} {v['rate']:.2f}" for k, v in rate["per_trace"].items())
        + f"); bench gets --timing r1={r1:.4f} --speed {args.speed:g}")
    live = out / "live"
    phases: dict[str, float] = {}
    if not args.compare_only:
        server, url = start_server(paths, args, out / "serve.log")
        try:
            cmd = specgen_cmd("optimize", *[str(bundled_problem(p)) for p in problems],
                              "--llm", "openai", "--base-url", url, "--model", MODEL,
                              "--tokenizer", str(args.tokenizer), "--modes", args.modes,
                              "--concurrency", str(args.concurrency), "--devices", args.devices,
                              "--max-iterations", str(args.max_iterations),
                              "--out", str(live), "--force", "--quiet")
            commands["live"] = cmd[2:]
            phases["live"] = run(cmd, out / "live.log")
        finally:
            stop_server(server)
    recorded = sorted((live / "traces" / "sequential").glob(f"*{TRACE_SUFFIX}"))
    if not recorded:
        raise SystemExit(f"no sequential traces were recorded in {live / 'traces' / 'sequential'}")
    for clock in clocks:
        bench = out / f"bench-{clock}"
        cmd = specgen_cmd("bench", *map(str, recorded), "--modes", args.modes, "--clock", clock,
                          "--concurrency", str(args.concurrency), "--devices", args.devices,
                          "--speed", f"{args.speed:g}", "--timing", f"r1={r1:.4f}",
                          "--out", str(bench), "--quiet")
        commands[f"bench-{clock}"] = cmd[2:]
        if not args.compare_only:
            phases[f"bench-{clock}"] = run(cmd, out / f"bench-{clock}.log")

    results = json.loads((live / "results.json").read_text())
    comparisons = {clock: compare(live, out / f"bench-{clock}", clock) for clock in clocks}
    report = {
        "target": f"each mode's end-to-end times within {TARGET:.0%} of the live suite's",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "settings": {"problems": problems, "modes": args.modes, "speed": args.speed,
                     "concurrency": args.concurrency, "devices": args.devices,
                     "max_iterations": args.max_iterations, "tokenizer": str(args.tokenizer),
                     "pace": "recorded"},
        "commands": {k: " ".join(v) for k, v in commands.items()},
        "argv": sys.argv,
        "served_rate": rate,
        "recorded_rate": {f"{p.parent.name}/{p.name}": recorded_rate(p, args.speed)
                          for mode_dir in sorted((live / "traces").iterdir()) if mode_dir.is_dir()
                          for p in sorted(mode_dir.glob(f"*{TRACE_SUFFIX}"))},
        "phases_s": phases,
        "comparisons": comparisons,
        "live_jobs": {f"{j['mode']}/{j['problem']}": live_breakdown(live, j) for j in results["jobs"]},
        "virtual": virtual_breakdown(out / "bench-virtual", r1, args.speed),
    }
    if not args.compare_only:
        report["wall_s"] = time.monotonic() - began
    elif (out / "suite_replay_check.json").is_file():
        # The run's own timings and commands stay as the run that made the folders wrote them.
        earlier = json.loads((out / "suite_replay_check.json").read_text())
        for key in ("phases_s", "wall_s", "date", "argv"):
            if key in earlier:
                report[key] = earlier[key]
    report["split"] = split(report["live_jobs"], report["virtual"], recorded)
    (out / "suite_replay_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    for clock, result in comparisons.items():
        say("\n" + table(result))
    say("\nwhere the time goes (replay: the virtual clock)\n" + split_table(report["split"]))
    say("recorded traces' rate, client tokens/s at speed 1: " + ", ".join(
        f"{k} {v:.2f}" for k, v in report["recorded_rate"].items() if v is not None)
        + f" (served R {r1:.2f})")
    verdict = all(m["all_within"] for c in comparisons.values() for m in c["medians"].values())
    say(f"\ntarget (every mode and problem within {TARGET:.0%}): {'met' if verdict else 'missed'}; "
        f"details in {out / 'suite_replay_check.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
