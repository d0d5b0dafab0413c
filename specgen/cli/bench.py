"""`specgen bench`: the four modes side by side on traces (imported, generated) or a live engine.

    specgen bench --generate 8 --turns 3 --concurrency 8          # generated problem-turns
    specgen bench traces/*.trace.json --fork-model named           # imported reasoning
    specgen bench --llm openai --base-url URL --model NAME --generate 8   # forks by a live model
    specgen bench --generate 8 --sensitivity                       # how the ratio moves
    specgen bench --generate 8 --repeats 3                         # an interval over seeds too

Writes results.json, report.md and PNG plots to --out.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from specgen.errors import UsageError
from specgen.optimize.engine_kinds import ENGINES
from specgen.optimize.fork_models import FORK_MODELS


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="compare specgen with the baselines on many problems",
                              description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="*", type=Path, help="trace files (specgen trace import writes them)")
    p.add_argument("--generate", type=int, default=0, metavar="N",
                   help="N generated problems (calibrated synthetic reasoning over the bundled problems)")
    p.add_argument("--turns", type=int, default=3, help="turns per generated problem")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--problems", default="", help="comma-separated bundled problems to generate for")
    p.add_argument("--modes", default="specgen,sequential,best-of-n,pipeline")
    p.add_argument("--fork-model", default="draft", choices=tuple(FORK_MODELS),
                   help="what a fork of replayed reasoning writes (optimize/fork_models.py)")
    p.add_argument("--llm", choices=tuple(k for k in ENGINES if k != "replay"),
                   help="a live engine for a fork model that needs one (--fork-model model)")
    p.add_argument("--model", help="model directory (vllm) or name (openai)")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--tokenizer", help="tokenizer directory for --llm openai")
    p.add_argument("--timing", action="append", default=[], metavar="NAME=VALUE",
                   help="override the timing model (r1, knee, beta, prefill_tps, ttft_floor_s, kv_fetch_tps)")
    p.add_argument("--clock", choices=("virtual", "wall"), default="virtual",
                   help="virtual (default): every distinct program of the traces evaluated once "
                        "for real, then every mode simulated on those verdicts and service times "
                        "(minutes at the real pace); wall: every mode run through the real loop "
                        "on real time (its check, and what --fork-model model needs)")
    p.add_argument("--speed", type=float, default=1.0,
                   help="modelled LLM time runs this many times faster than real time while "
                        "evaluation does not (1: the regime of a real run; other values are a "
                        "sensitivity axis, and the report says so)")
    p.add_argument("--concurrency", type=int, default=4, help="jobs at once per mode")
    p.add_argument("--devices", default="", help="evaluation devices, e.g. cuda:0,cuda:1 (default: GPUs, else 2 CPU workers)")
    p.add_argument("--eval-timeout", type=float, default=None, metavar="S",
                   help="wall seconds one candidate's run may take (default: the evaluation's 300)")
    p.add_argument("--no-prefix-cache", action="store_true", help="forks pay for their whole prompt")
    p.add_argument("--time-budget", type=float, default=None, help="wall seconds per job")
    p.add_argument("--margin", type=float, default=0.1,
                   help="a kernel beating the ones before it by this fraction ends its turn, as in "
                        "optimize (default 0.1)")
    p.add_argument("--builds-ahead", action="store_true",
                   help="build the traces' extensions before the timed run, leaving build time out "
                        "of every mode's times (default: each mode's run waits for its builds, as "
                        "a live run does)")
    p.add_argument("--fork-max-tokens", type=int, default=2048,
                   help="longest fork a live engine writes (--fork-model model; default 2048)")
    p.add_argument("--kv-pool-effect", action="store_true",
                   help="the main run with the shared prefix evicted from the engine's cache "
                        "(--no-prefix-cache), and beside it the same with forks fetching the prefix "
                        "from the remote KV pool (the timing model's kv_fetch_tps)")
    p.add_argument("--repeats", type=int, default=1, metavar="N",
                   help="run the main comparison N times (generated traces: seeds --seed, "
                        "--seed+1, ...; given traces: the same traces again) and report an "
                        "interval over the repeats beside the one over problems")
    p.add_argument("--sensitivity", action="store_true",
                   help="also run the fork models, decode x0.5 and x2, and draft positions +-10 points")
    p.add_argument("--measured", type=Path, default=None, metavar="FILE",
                   help="--clock virtual: take the programs' verdicts and service times from an "
                        "earlier virtual run (its results.json or measured.jsonl, e.g. measured "
                        "on a GPU machine) instead of measuring them here; the same traces needed")
    p.add_argument("--out", type=Path, default=Path("specgen-runs/bench"))
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=bench_main)


def _devices(arg: str) -> list[str]:
    if arg:
        return [d.strip() for d in arg.split(",") if d.strip()]
    from specgen.cli.optimize_job import default_devices as _default_devices

    devices = _default_devices()
    return devices if any(d.startswith("cuda") for d in devices) else ["cpu", "cpu"]


def _problems(args: argparse.Namespace, devices: list[str], shift: float = 0.0):
    from specgen.optimize.bench_problems import generated_problems, problems_from_traces

    problems = problems_from_traces(args.traces) if args.traces else []
    if args.generate:
        gpu = any(d.startswith("cuda") for d in devices)
        # Candidates this machine can time for real: compiled C++ and torch on a CPU (Triton only
        # interprets there), every language on a GPU.
        langs = ("torch", "triton", "cuda", "cpp") if gpu else ("torch", "cpp")
        names = [n.strip() for n in args.problems.split(",") if n.strip()] or None
        problems += generated_problems(args.generate, args.turns, args.seed, names, langs, shift)
    return problems


def _engine_settings(args: argparse.Namespace) -> dict[str, str] | None:
    """The live engine's description (`--llm` and the flags its kind takes), as a job carries it
    and as results.json records it."""
    if args.llm is None:
        return None
    given = {"llm": args.llm, "model": args.model, "base_url": args.base_url,
             "tokenizer": args.tokenizer}
    kind = ENGINES[args.llm]
    return {k: v for k, v in given.items() if v is not None and k in kind.keys}


async def _live_engine(args: argparse.Namespace):
    """The engine forks are written by with a fork model that needs one (started here), built by
    the engine registry (`optimize/engine_kinds.py`) from the same description a job carries."""
    settings = _engine_settings(args)
    if settings is None:
        return None
    from specgen.optimize.engine_kinds import build_engine

    engine = build_engine(settings, "", where=f"bench --llm {args.llm}")
    start = getattr(engine, "start", None)
    if start is not None:
        await start()
    return engine


def bench_main(args: argparse.Namespace) -> int:
    from specgen.bench.config import BenchConfig
    from specgen.engines.timing_model import TimingModel

    needs_engine = FORK_MODELS[args.fork_model].needs_engine
    if needs_engine and args.llm is None:
        raise UsageError(f"bench: --fork-model {args.fork_model} needs a live engine: --llm vllm|openai")
    if not args.traces and not args.generate:
        raise UsageError("bench: give trace files or --generate N")
    devices = _devices(args.devices)
    timing = TimingModel.from_overrides(args.timing)
    base = BenchConfig(problems=_problems(args, devices), modes=args.modes.split(","),
                       fork_model=args.fork_model, timing=timing, speed=args.speed,
                       concurrency=args.concurrency, devices=devices,
                       prefix_cache=not args.no_prefix_cache, time_budget_s=args.time_budget,
                       improvement_margin=args.margin,
                       label="main", cache_dir=args.out.resolve() / "eval-cache",
                       prebuild=args.builds_ahead, fork_max_tokens=args.fork_max_tokens,
                       fork_engine=_engine_settings(args))
    from specgen.cli.optimize_job import eval_options_of

    base.eval_options = {**base.eval_options, **eval_options_of(args)}
    base.check()
    if args.clock == "virtual":
        wall_only = [flag for flag, given in ((f"--fork-model {args.fork_model}", needs_engine),
                                               ("--kv-pool-effect", args.kv_pool_effect),
                                               ("--sensitivity", args.sensitivity),
                                               ("--time-budget", args.time_budget is not None))
                     if given]
        if wall_only:
            raise UsageError(f"bench: {', '.join(wall_only)} needs --clock wall (the virtual clock "
                             "simulates the draft and named fork models only)")
    if args.repeats < 1:
        raise UsageError(f"bench: --repeats {args.repeats}: give 1 or more")
    variants = [("main", base)]
    if args.repeats > 1:
        from dataclasses import replace

        for k in range(1, args.repeats):
            seeded = argparse.Namespace(**{**vars(args), "seed": args.seed + k})
            variants.append((f"repeat {k}", replace(base, problems=_problems(seeded, devices),
                                                    label=f"repeat-{k}")))
    if args.kv_pool_effect:
        from dataclasses import replace

        base.prefix_cache = False
        variants.append(("KV pool on (prefix evicted)", replace(base, kv_pool=True, label="kv_pool")))
    if args.sensitivity:
        from dataclasses import replace

        for model, spec in FORK_MODELS.items():
            if model != base.fork_model and (args.llm or not spec.needs_engine):
                variants.append((f"fork model {model}", replace(base, fork_model=model, label=model)))
        # What cancelling the speculative candidates still owed at a job's end buys and costs.
        variants.append(("speculative tail drained", replace(base, drain_speculative=True, label="drain")))
        variants.append(("decode x0.5", replace(base, timing=timing.scaled(0.5), label="slow")))
        variants.append(("decode x2", replace(base, timing=timing.scaled(2.0), label="fast")))
        if args.generate:
            for shift in (-0.10, 0.10):
                variants.append((f"draft positions {shift:+.0%}",
                                 replace(base, problems=_problems(args, devices, shift),
                                         label=f"shift{shift:+.2f}")))
    if args.clock == "virtual":
        if args.measured is not None and len(variants) > 1:
            raise UsageError("bench --measured: the repeats' traces differ from the measured ones; "
                             "give --repeats 1")
        return _run_virtual(args, variants)
    if args.measured is not None:
        raise UsageError("bench --measured needs --clock virtual (the wall clock evaluates as it runs)")
    return asyncio.run(_run_variants(args, variants))


def _run_virtual(args: argparse.Namespace, variants) -> int:
    """`--clock virtual`: each variant (the main run, the repeats) measured, then simulated."""
    from specgen.runtime.private_files import make_private_dir, write_private
    from specgen.bench.virtual import run_virtual, table

    out: Path = make_private_dir(args.out)
    say = (lambda text: None) if args.quiet else print
    rows, missing = [], []
    for label, config in variants:
        say(f"== {label}: measuring every program of the traces, then simulating "
            f"{', '.join(config.modes)}")
        summary = run_virtual(config, args.seed, say,
                              measured=args.measured if label == "main" else None)
        folder = make_private_dir(out if label == "main" else out / config.label)
        write_private(folder / "results.json", json.dumps(summary, indent=2, default=str))
        text = table(summary)
        write_private(folder / "report.md", text + "\n")
        if not args.quiet:
            print(f"\n== {label}\n{text}")
        if summary["no_headline"]:
            missing.append(f"{label}: {summary['no_headline']}")
        r = summary["ratios"]
        rows.append({"variant": label, "ratio": (r.get("vs_best_fair_baseline") or {}).get("geomean"),
                     "low": (r.get("vs_best_fair_baseline") or {}).get("low"),
                     "high": (r.get("vs_best_fair_baseline") or {}).get("high"),
                     "vs_sequential": (r.get("vs_sequential") or {}).get("geomean")})
    _write_repeats(args, out, rows)
    print(f"results in {out}")
    if missing:
        print(f"bench: {missing[0]}", file=sys.stderr)
        return 1
    return 0


def _write_repeats(args: argparse.Namespace, out: Path, rows: list[dict]) -> None:
    """repeats.md and repeats.json: the main run's ratio and its repeats', with the interval over
    them (nothing with one run)."""
    if len(rows) < 2:
        return
    from specgen.bench.report import over_repeats
    from specgen.runtime.private_files import write_private

    text = over_repeats(rows, "seeds" if args.generate and not args.traces else "runs")
    write_private(out / "repeats.md", text + "\n")
    write_private(out / "repeats.json", json.dumps(rows, indent=2))
    if not args.quiet:
        print("\n" + text)


async def _run_variants(args: argparse.Namespace, variants) -> int:
    from specgen.bench.report import plot, summarize, table, write_results
    from specgen.runtime.private_files import make_private_dir, write_private

    engine = await _live_engine(args)
    out: Path = make_private_dir(args.out)
    sensitivity = []
    missing: list[str] = []
    try:
        for label, config in variants:
            config.live_engine = engine
            total = len(config.problems) * len(config.modes)
            run = await _with_progress(config, total, label, args.quiet)
            summary = summarize(run)
            if summary.get("no_headline"):
                missing.append(f"{label}: {summary['no_headline']}")
            folder = out if label == "main" else out / config.label
            write_results(run, summary, folder)
            plot(run, summary, folder)
            text = table(summary)
            write_private(folder / "report.md", text + "\n")
            if not args.quiet:
                print(f"\n== {label}\n{text}")
            r = summary["ratios"].get("end_to_end_s", {})
            near = summary["ratios"].get("to_near_best_s", {})
            vs_seq = summary["ratios"].get("end_to_end_s_vs_sequential", {})
            sensitivity.append({"variant": label, "ratio": r.get("geomean"), "low": r.get("low"),
                                "high": r.get("high"), "vs_sequential": vs_seq.get("geomean"),
                                "near_best": near.get("geomean"),
                                "feedback": summary["ratios"].get("profiled_vs_sequential"),
                                "ceiling": summary["ceiling"]})
    finally:
        if engine is not None:
            await engine.close()
    _write_repeats(args, out, [row for row in sensitivity if row["variant"] == "main"
                               or row["variant"].startswith("repeat ")])
    if len(sensitivity) > 1:
        lines = ["| variant | specgen / best fair baseline (end-to-end, geo) | 95% CI | to near-best (geo) "
                 "| profiled vs sequential | ceiling |",
                 "| --- | --- | --- | --- | --- | --- |"]
        for row in sensitivity:
            fmt = (lambda x: "-" if x is None else f"{x:.3f}")
            lines.append(f"| {row['variant']} | {fmt(row['ratio'])} | {fmt(row['low'])}-{fmt(row['high'])} "
                         f"| {fmt(row['near_best'])} | {fmt(row['feedback'])} | {row['ceiling']:.3f} |")
        write_private(out / "sensitivity.md", "\n".join(lines) + "\n")
        write_private(out / "sensitivity.json", json.dumps(sensitivity, indent=2))
        if not args.quiet:
            print("\n" + "\n".join(lines))
    print(f"results in {out}")
    if missing:
        print(f"bench: {missing[0]}", file=sys.stderr)
        return 1
    return 0


async def _with_progress(config, total: int, label: str, quiet: bool):
    from specgen.bench.wall import run_bench

    if quiet:
        return await run_bench(config)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn()) as progress:
        task = progress.add_task(f"bench {label}", total=total)
        began = time.monotonic()

        def done(job) -> None:
            best = job.result.best_speedup
            progress.console.print(f"{job.mode:10} {job.problem:24} {job.result.metrics.end_to_end_s:7.1f} s  "
                                   f"profiled {job.result.metrics.profiled:3}  best "
                                   f"{'-' if best is None else f'{best:.3f}x'}  "
                                   f"[{time.monotonic() - began:.0f} s]")
            progress.advance(task)

        return await run_bench(config, on_job_done=done)
