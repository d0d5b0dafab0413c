"""`specgen simulate`: the command line of the simulator (docs/simulate.md)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate", help="discrete-event run of many jobs on many GPUs through the real scheduler core",
        description="Simulate J jobs on G GPUs (reasoning engines + evaluation pool) on a virtual "
                    "clock, driving SchedulerCore and the loop's trigger gates and termination; "
                    "service times from a bench results.json, LLM rates from the timing model.")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--jobs", type=int, default=4, help="concurrent jobs (a finished job's slot takes a new one)")
    p.add_argument("--eval-fraction", type=float, default=0.5,
                   help="share of the GPUs in the evaluation pool (the rest run reasoning engines)")
    p.add_argument("--eval-gpus", type=int, default=None, help="evaluation GPUs, instead of --eval-fraction")
    pools = p.add_mutually_exclusive_group()
    pools.add_argument("--elastic", dest="elastic", action="store_true", default=True,
                       help="elastic validation/profiling pools (default)")
    pools.add_argument("--static", dest="elastic", action="store_false",
                       help="the baselines' fixed split (half validation)")
    p.add_argument("--mode", default="specgen", help="the jobs' mode (specgen, sequential, best-of-n, pipeline)")
    p.add_argument("--turns", type=int, default=4, help="iterations per job")
    p.add_argument("--hours", type=float, default=1.0, help="simulated duration")
    p.add_argument("--from-bench", type=Path, help="bench results.json (or its folder): service times")
    p.add_argument("--replay-bench", type=Path, help="simulate this bench run's configuration and "
                   "print predicted vs measured")
    p.add_argument("--timing", action="append", default=[], metavar="NAME=VALUE",
                   help="timing model override (specgen/engines/timing_model.py)")
    p.add_argument("--spare-processes", type=int, default=None,
                   help="runner processes each worker keeps started ahead (the runtime setting "
                        "spare_processes; default: its default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="folder for results.json, report.md, plots")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specgen.engines.timing_model import TimingModel
    from specgen.errors import UsageError
    from specgen.simulate import report
    from specgen.simulate.bench_replay import replay, table
    from specgen.simulate.model import ServiceTimes
    from specgen.simulate.workload import bench_problems, build

    if args.spare_processes is not None and args.spare_processes < 0:
        raise UsageError(f"--spare-processes must be >= 0, got {args.spare_processes}")
    settings = {} if args.spare_processes is None else {"spare_processes": args.spare_processes}
    if args.replay_bench:
        result = replay(args.replay_bench, seed=args.seed, settings=settings)
        text = table(result)
        print(text)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "replay.json").write_text(json.dumps(result, indent=1, default=str))
            (args.out / "replay.md").write_text(text + "\n")
        return 0
    if not args.from_bench:
        raise UsageError("give --from-bench RESULTS.json: evaluation service times are taken from "
                         "a measured bench run, never assumed")
    service = ServiceTimes.from_bench(args.from_bench)
    sim = build(args.gpus, args.jobs, service, eval_fraction=args.eval_fraction,
                eval_gpus=args.eval_gpus, elastic=args.elastic, hours=args.hours, seed=args.seed,
                mode=args.mode, timing=TimingModel.from_overrides(args.timing),
                problems=bench_problems(args.from_bench), turns=args.turns, settings=settings)
    result = sim.run()
    print(report.markdown(result))
    if args.out:
        paths = report.write(result, args.out, {"service_times": service.summary(),
                                                "timing": sim.cfg.timing.to_dict()})
        print("wrote " + ", ".join(str(p) for p in paths))
    return 0
