#!/usr/bin/env python3
"""Elastic vs static validation/profiling pools under synthetic bursty arrivals.

Two steps:

  record   evaluates the bundled problems' candidates (PyTorch and Triton, plus failing ones) with
           the real evaluation service on this machine's CPU, one stage at a time, and writes each
           candidate's validation and profiling service times and outcome to a recording
           (tools/data/pool_bench_recording.json).
  run      (default) replays that recording on CPU workers that sleep for the recorded service
           times (`--evaluator replay`, time-scaled by --time-scale) behind a real scheduler, for
           the same seeded arrival trace under each pool configuration: elastic (measured-load
           split with lending), elastic without lending, and every static split. Arrivals come in
           bursts (the forks of one reasoning stream) and their mix shifts from mostly failing
           candidates (validation-heavy) to mostly correct ones (profiling-heavy) and back.

Reported per configuration: busy share of workers while requests wait, per-pool utilization,
feedback latency (candidate extracted -> profiling verdict) p50/p95, and time to drain the trace.

    .venv/bin/python tools/pool_bench.py record
    .venv/bin/python tools/pool_bench.py run --workers 4 --duration 40 --out out/pool_bench.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specgen.messages import CandidateSubmission  # noqa: E402
from specgen.runtime.local import LocalCluster  # noqa: E402
from specgen.runtime.replay_evaluator import Recording, ReplaySample, directive, write_recording  # noqa: E402
from specgen.runtime.settings import RuntimeSettings  # noqa: E402

RECORDING = ROOT / "tools" / "data" / "pool_bench_recording.json"
PROBLEMS = ROOT / "specgen" / "data" / "problems"


# ------------------------------------------------------------------------------------ record
def _failing_variants(source: str) -> list[str]:
    """Candidates that fail the way LLM output often does: does not compile, or wrong numbers."""
    broken = source.replace("def forward(self", "def forward(self,, ", 1)
    wrong = re.sub(r"(\n\s+return )(.+)\n", r"\1(\2) * 1.5\n", source, count=1)
    return [broken, wrong]


def record(out: Path) -> None:
    from specgen.eval import EvalWorker

    samples: list[ReplaySample] = []
    work = ROOT / "out" / "pool_bench_record"
    with EvalWorker(device="cpu", work_dir=work, spare_processes=1) as worker:
        for problem_path in sorted(PROBLEMS.glob("*.py")):
            problem = problem_path.read_text()
            sources = []
            for kind in ("torch", "triton"):
                path = PROBLEMS / "candidates" / f"{problem_path.stem}_{kind}.py"
                if path.exists():
                    sources.append(path.read_text())
            sources += _failing_variants(sources[0])
            for i, source in enumerate(sources):
                sub = CandidateSubmission(job_id="record", candidate_id=f"{problem_path.stem}-{i}",
                                          problem_name=problem_path.stem, problem_source=problem,
                                          candidate_source=source)
                t = time.monotonic()
                v = worker.run(sub, stage="validate")
                validate_s = time.monotonic() - t
                profile_s, speedup = 0.0, None
                if v.correct:
                    t = time.monotonic()
                    p = worker.run(sub, stage="profile")
                    profile_s, speedup = time.monotonic() - t, p.speedup
                samples.append(ReplaySample(validate_s=round(validate_s, 3), correct=v.correct,
                                            profile_s=round(profile_s, 3), speedup=speedup))
                print(f"{sub.candidate_id:24s} validate {validate_s:6.2f} s correct={v.correct!s:5s} "
                      f"profile {profile_s:6.2f} s  {v.error or ''}"[:160], flush=True)
    source = (f"specgen EvalWorker on {platform.node()} ({os.cpu_count()} CPU cores), default EvalOptions, "
              f"stages run separately, {time.strftime('%Y-%m-%d')}; bundled problems, their PyTorch and "
              "Triton candidates and two failing variants of each")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_recording(out, Recording(source=source, samples=samples))
    print(f"wrote {len(samples)} samples to {out}")


# ------------------------------------------------------------------------------------ trace
def make_trace(recording: Recording, duration: float, seed: int, scale: float, mean_gap: float,
               streams: int) -> list[tuple[float, ReplaySample]]:
    """(arrival offset s, sample) pairs: `streams` reasoning streams, each emitting bursts of forks;
    the share of correct candidates goes 0.2 -> 0.8 -> 0.5 over the three thirds of the run."""
    rng = random.Random(seed)
    good = [s for s in recording.samples if s.correct]
    bad = [s for s in recording.samples if not s.correct]
    trace: list[tuple[float, ReplaySample]] = []
    for _ in range(streams):
        t = rng.uniform(0, mean_gap)
        while t < duration:
            share_good = (0.2, 0.8, 0.5)[min(2, int(3 * t / duration))]
            for k in range(rng.randint(1, 6)):                    # one burst of forks
                base = rng.choice(good if rng.random() < share_good else bad)
                trace.append((t + 0.05 * k, ReplaySample(
                    validate_s=base.validate_s * scale, correct=base.correct,
                    profile_s=base.profile_s * scale, speedup=base.speedup)))
            t += rng.expovariate(1.0 / mean_gap)
    trace.sort(key=lambda item: item[0])
    return trace


async def drive(cluster: LocalCluster, trace: list[tuple[float, ReplaySample]], drain_timeout: float
                ) -> dict[str, Any]:
    backend = cluster.backend()
    expected = {f"c{i}": (2 if s.correct else 1) for i, (_, s) in enumerate(trace)}
    remaining = sum(expected.values())
    latencies: list[float] = []
    extracted: dict[str, float] = {}
    done = asyncio.Event()

    async def collect() -> None:
        nonlocal remaining
        async for upd in backend.updates():
            if upd.stage == "profile" and not upd.cancelled:
                latencies.append(upd.finished_at - extracted[upd.candidate_id])
            remaining -= 1
            if remaining == 0:
                done.set()
                return

    collector = asyncio.ensure_future(collect())
    start = time.monotonic()
    for i, (offset, sample) in enumerate(trace):
        delay = start + offset - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        cid = f"c{i}"
        extracted[cid] = time.time()
        await backend.submit(CandidateSubmission(
            job_id="bench", candidate_id=cid, problem_name="bench", problem_source="",
            candidate_source=directive(sample), origin="fork", extracted_at=extracted[cid]))
    await asyncio.wait_for(done.wait(), drain_timeout)
    makespan = time.monotonic() - start
    collector.cancel()
    stats = cluster.client.stats()
    ordered = sorted(latencies)
    return {
        "candidates": len(trace), "profiled": len(latencies), "makespan_s": makespan,
        "busy_while_waiting": stats.busy_while_waiting,
        "utilization_validate": stats.validate.utilization, "utilization_profile": stats.profile.utilization,
        "feedback_p50_s": statistics.median(ordered) if ordered else None,
        "feedback_p95_s": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else None,
        "scheduler_feedback_p50_s": stats.feedback_latency_p50_s,
        "scheduler_feedback_p95_s": stats.feedback_latency_p95_s,
        "reassignments": stats.reassignments,
    }


def run(args: argparse.Namespace) -> None:
    recording = json.loads(Path(args.recording).read_text())
    import msgspec

    rec = msgspec.convert(recording, Recording)
    trace = make_trace(rec, args.duration, args.seed, args.time_scale, args.mean_gap, args.streams)
    validate_load = sum(s.validate_s for _, s in trace) / args.duration
    profile_load = sum(s.profile_s for _, s in trace) / args.duration
    print(f"trace: {len(trace)} candidates over {args.duration:g} s, offered load {validate_load:.2f} "
          f"validation + {profile_load:.2f} profiling workers of {args.workers}", flush=True)
    configs: list[tuple[str, RuntimeSettings]] = [
        ("elastic", RuntimeSettings(pool_mode="elastic")),
        ("elastic, no lending", RuntimeSettings(pool_mode="elastic", lend_idle_workers=False)),
    ] + [(f"static {v}V/{args.workers - v}P", RuntimeSettings(pool_mode="static", static_validate_workers=v))
         for v in range(1, args.workers)]
    results: dict[str, Any] = {}
    for name, settings in configs:
        with LocalCluster(workers=args.workers, evaluator="replay", settings=settings) as cluster:
            r = asyncio.run(drive(cluster, trace, drain_timeout=args.duration * 10))
        results[name] = r
        print(f"{name:22s} busy-while-waiting {r['busy_while_waiting'] or 0:6.1%}  "
              f"util V {r['utilization_validate']:5.1%} P {r['utilization_profile']:5.1%}  "
              f"feedback p50 {r['feedback_p50_s']:6.2f} s p95 {r['feedback_p95_s']:6.2f} s  "
              f"drain {r['makespan_s']:6.1f} s  moves {r['reassignments']}", flush=True)
    static = {k: v for k, v in results.items() if k.startswith("static")}
    best = min(static, key=lambda k: static[k]["feedback_p95_s"])
    summary = {"best_static": best, "elastic_p95_vs_best_static":
               results["elastic"]["feedback_p95_s"] / static[best]["feedback_p95_s"]}
    print(f"best static split by p95 feedback latency: {best}; elastic p95 / best static p95 = "
          f"{summary['elastic_p95_vs_best_static']:.2f}")
    report = {"machine": f"{platform.node()}, {os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d"),
              "recording": rec.source, "time_scale": args.time_scale, "workers": args.workers,
              "duration_s": args.duration, "seed": args.seed, "candidates": len(trace),
              "offered_load_workers": {"validate": validate_load, "profile": profile_load},
              "results": results, "summary": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", nargs="?", default="run", choices=("run", "record"))
    parser.add_argument("--recording", type=Path, default=RECORDING)
    parser.add_argument("--workers", type=int, default=4, help="CPU workers standing in for GPUs")
    parser.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals")
    parser.add_argument("--time-scale", type=float, default=0.1, help="multiply recorded service times")
    parser.add_argument("--mean-gap", type=float, default=2.0, help="mean seconds between bursts per stream")
    parser.add_argument("--streams", type=int, default=4, help="reasoning streams emitting bursts")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "pool_bench.json")
    args = parser.parse_args()
    if args.step == "record":
        record(args.recording)
    else:
        run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
