"""Projections of `specgen simulate`: 8, 64 and 512 GPUs with 1 to 256 concurrent jobs, elastic
vs static pools, one simulated hour each (by default), service times from a bench results.json.

    .venv/bin/python tools/simulate_projections.py --from-bench RESULTS.json --out DIR
        [--hours 1] [--gpus 8,64,512] [--jobs 1,4,16,64,256] [--eval-fraction 0.5] [--seed 0]

Writes DIR/projections.json, DIR/projections.md (the table, with the real seconds each run took)
and DIR/projections.png (evaluation utilization and p95 feedback latency against jobs).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from specgen.simulate.model import ServiceTimes
from specgen.simulate.workload import bench_problems, build


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from-bench", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--hours", type=float, default=1.0)
    p.add_argument("--gpus", default="8,64,512")
    p.add_argument("--jobs", default="1,4,16,64,256")
    p.add_argument("--eval-fraction", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    service = ServiceTimes.from_bench(args.from_bench)
    problems = bench_problems(args.from_bench)
    rows = []
    for gpus in [int(x) for x in args.gpus.split(",")]:
        for jobs in [int(x) for x in args.jobs.split(",")]:
            for elastic in (True, False):
                started = time.perf_counter()
                sim = build(gpus, jobs, service, eval_fraction=args.eval_fraction, elastic=elastic,
                            hours=args.hours, seed=args.seed, problems=problems)
                r = sim.run()
                row = {"gpus": gpus, "jobs": jobs, "pools": "elastic" if elastic else "static",
                       "eval_gpus": r["eval_gpus"], "engines": r["reasoning_engines"],
                       "utilization": r["utilization"]["all"],
                       "busy_while_waiting": r["utilization"]["busy_while_waiting"],
                       "feedback_p50_s": r["feedback_latency_s"]["p50"],
                       "feedback_p95_s": r["feedback_latency_s"]["p95"],
                       "feedback_n": r["feedback_latency_s"]["n"],
                       "jobs_finished": r["jobs_finished"], "end_to_end_p50_s": r["end_to_end_s"]["p50"],
                       "decision_p50_us": (r["decision_time_s"]["p50"] or 0) * 1e6,
                       "decision_p99_us": (r["decision_time_s"]["p99"] or 0) * 1e6,
                       "decision_total_s": r["decision_time_s"]["total"],
                       "real_s": time.perf_counter() - started}
                rows.append(row)
                print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "projections.json").write_text(json.dumps(
        {"bench": str(args.from_bench), "hours": args.hours, "service_times": service.summary(),
         "rows": rows}, indent=1))
    (args.out / "projections.md").write_text(table(rows, args.hours) + "\n")
    plot(rows, args.out / "projections.png")
    print(table(rows, args.hours))
    return 0


def table(rows: list[dict], hours: float) -> str:
    def f(x, spec=".3g"):
        return "-" if x is None else format(x, spec)
    lines = [f"Simulated {hours:g} h per run.", "",
             "| GPUs | jobs | pools | eval GPUs | engines | utilization | busy while waiting | "
             "feedback p50 / p95 s (n) | jobs finished | e2e p50 s | decision p50 / p99 us | real s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(
            f"| {r['gpus']} | {r['jobs']} | {r['pools']} | {r['eval_gpus']} | {r['engines']} | "
            f"{f(r['utilization'])} | {f(r['busy_while_waiting'])} | {f(r['feedback_p50_s'])} / "
            f"{f(r['feedback_p95_s'])} ({r['feedback_n']}) | {r['jobs_finished']} | "
            f"{f(r['end_to_end_p50_s'])} | {r['decision_p50_us']:.0f} / {r['decision_p99_us']:.0f} | "
            f"{r['real_s']:.1f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for k, gpus in enumerate(sorted({r["gpus"] for r in rows})):
        for pools, style in (("elastic", "-"), ("static", "--")):
            sel = [r for r in rows if r["gpus"] == gpus and r["pools"] == pools]
            xs = [r["jobs"] for r in sel]
            a.plot(xs, [r["utilization"] or 0 for r in sel], style, marker="o", color=f"C{k}",
                   label=f"{gpus} GPUs {pools}")
            b.plot(xs, [r["feedback_p95_s"] or float("nan") for r in sel], style, marker="o",
                   color=f"C{k}", label=f"{gpus} GPUs {pools}")
    for ax, title in ((a, "evaluation GPUs busy (share)"), (b, "feedback latency p95 (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent jobs")
        ax.set_title(title, fontsize=9)
    a.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
