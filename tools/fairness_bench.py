#!/usr/bin/env python3
"""Several jobs from several clients on one scheduler: do all finish, and does any starve?

    .venv/bin/python tools/fairness_bench.py --jobs 8 --clients 2 --nodes 2 --out fairness.json

A scheduler and NODES nodes (one CPU worker each) run as processes (`LocalCluster`); CLIENTS
client threads, each with its own `Client` (its own socket and identity), submit JOBS jobs between
them at once: the optimize loop on bundled problems' replayed traces (`--fork-model draft`, the
default timing model at `--speed`), every candidate validated and profiled for real. Per job: time
from submission to its first validation verdict and to its end. Target: every job finishes with its
own result; every job's first validation within 2x of the median job's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specgen.messages import JobSpec, OptimizeSpec  # noqa: E402
from specgen.optimize.job import ENGINE_OPTION, ENTRY  # noqa: E402
from specgen.runtime.client import Client  # noqa: E402
from specgen.runtime.local import LocalCluster  # noqa: E402
from specgen.traces.bundled import bundled_problems, bundled_trace  # noqa: E402


def job_spec(problem: str, index: int, speed: float) -> JobSpec:
    source = bundled_problems()[problem].read_text()
    options = {"mode": "specgen", "max_iterations": 1,
               ENGINE_OPTION: {"llm": "replay", "trace": str(bundled_trace(problem)),
                               "speed": speed, "fork_model": "draft"}}
    assert set(options) - {ENGINE_OPTION} <= set(OptimizeSpec.__struct_fields__)
    return JobSpec(job_id=f"fair-{index}-{problem}", problem_name=problem, problem_source=source,
                   entry=ENTRY, options=options)


def follow(address: str, specs: list[JobSpec], rows: list[dict], lock: threading.Lock) -> None:
    with Client(address) as client:
        started = {}
        jobs = []
        for spec in specs:
            started[spec.job_id] = time.monotonic()
            jobs.append(client.submit(spec))
        threads = [threading.Thread(target=_watch, args=(job, started[job.job_id], rows, lock))
                   for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def _watch(job, started: float, rows: list[dict], lock: threading.Lock) -> None:
    first_validation = None
    for event in job.events(timeout=900):
        if (event.kind == "verdict" and event.data.get("stage") == "validate"
                and first_validation is None and not event.data.get("cancelled")):
            first_validation = time.monotonic() - started
    result = job.result(timeout=60)
    with lock:
        rows.append({"job": job.job_id, "status": result.status, "result_job": result.job_id,
                     "first_validation_s": first_validation,
                     "finished_s": time.monotonic() - started,
                     "best_candidate": result.best_candidate_id})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--speed", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=Path("fairness.json"))
    args = parser.parse_args()
    problems = [p for p in sorted(bundled_problems()) if bundled_trace(p) is not None]
    specs = [job_spec(problems[i % len(problems)], i, args.speed) for i in range(args.jobs)]
    rows: list[dict] = []
    lock = threading.Lock()
    began = time.monotonic()
    with LocalCluster(workers=args.nodes, nodes=args.nodes) as cluster:
        threads = [threading.Thread(target=follow, args=(cluster.address, specs[c::args.clients], rows, lock))
                   for c in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = cluster.client.stats()
    wall = time.monotonic() - began
    firsts = [r["first_validation_s"] for r in rows if r["first_validation_s"] is not None]
    median = statistics.median(firsts) if firsts else None
    worst = max(firsts) / median if firsts and median else None
    own = all(r["result_job"] == r["job"] for r in rows)
    print(f"{'job':28} {'status':10} {'first validation s':>19} {'finished s':>11}")
    for r in sorted(rows, key=lambda r: r["job"]):
        fv = "-" if r["first_validation_s"] is None else f"{r['first_validation_s']:.1f}"
        print(f"{r['job']:28} {r['status']:10} {fv:>19} {r['finished_s']:11.1f}")
    print(f"{len(rows)}/{args.jobs} finished, each with its own result: {own}; first validation "
          f"median {median:.1f} s, worst/median {worst:.2f} (target <= 2); wall {wall:.0f} s; "
          f"scheduler jobs {stats.jobs_by_state}")
    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "args": vars(args) | {"out": str(args.out)},
                                    "rows": rows, "median_first_validation_s": median,
                                    "worst_over_median": worst, "own_results": own, "wall_s": wall},
                                   indent=1))
    ok = len(rows) == args.jobs and own and worst is not None and worst <= 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
