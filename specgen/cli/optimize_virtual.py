"""`specgen optimize --clock virtual`: a replayed trace's job on the virtual clock, in the time its
evaluations take.

A replay paced at the timing model's real rate takes as long as the recorded reasoning (a median
turn of about 9.6k tokens is about 3 minutes at 56 tokens/s, a long one twice that). On the virtual
clock the job is what `specgen bench --clock virtual` does for one trace (bench/virtual.py): every
program the trace can submit (each complete draft its reasoning holds, each answer) is validated
and profiled for real, once, on this machine's evaluation devices; then the job's mode and a
sequential run of the same trace run on those verdicts and service times through the simulator
(the scheduler core, the loop's triggers and termination, the timing model at `--speed`). The
screen (optimize/first_run.py) shows the chosen mode against that sequential run.

The first run (`specgen optimize` with no problem and no engine) runs this way unless `--clock
wall` asks for the real runtime at the reasoning's real pace.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

from specgen.cli.optimize_job import Plan
from specgen.errors import UsageError

# Flags whose effect the virtual clock does not model, with their defaults.
_WALL_ONLY = {"scheduler": None, "resume": None, "time_budget": None, "token_budget": None,
              "max_iterations": None, "no_forking": False, "no_early_termination": False,
              "no_inline_candidates": False, "no_load_aware": False, "static_pools": False,
              "drain_speculative": False, "evaluation": None, "kv_pool": "auto"}


def _wall_only_given(args: argparse.Namespace) -> list[str]:
    return [f"--{name.replace('_', '-')}" for name, default in _WALL_ONLY.items()
            if getattr(args, name, default) != default]


def wants_virtual(args: argparse.Namespace) -> bool:
    """`--clock`, or by default: virtual for the first run (no problem, no engine, no trace, and
    no flag that only the runtime's run takes)."""
    clock = getattr(args, "clock", None)       # a resumed run's saved flags may predate it
    if clock is not None:
        return clock == "virtual"
    return (args.problem is None and args.llm is None and args.trace is None
            and not _wall_only_given(args))


def check(args: argparse.Namespace, plan: Plan) -> None:
    from specgen.optimize.fork_models import replayable_fork_models

    if plan.llm != "replay":
        raise UsageError(f"--clock virtual replays a trace; --llm {plan.llm} runs a live model on "
                         "real time (use --clock wall)")
    if args.fork_model not in replayable_fork_models():
        raise UsageError(f"--clock virtual: fork model {args.fork_model!r} is not simulated (virtual: "
                         f"{', '.join(replayable_fork_models())}; --clock wall runs the others)")
    given = _wall_only_given(args)
    if given:
        raise UsageError(f"{', '.join(given)} needs --clock wall (the virtual clock runs the mode's "
                         "own mechanisms to the end of the trace)")


def run(args: argparse.Namespace, plan: Plan, devices: list[str], eval_options: dict[str, Any],
        say: Callable[[str], None]) -> int:
    from specgen.bench.config import BenchConfig, programs_in
    from specgen.bench.virtual import run_virtual
    from specgen.engines.timing_model import TimingModel
    from specgen.optimize import first_run
    from specgen.optimize.bench_problems import BenchProblem
    from specgen.optimize.outputs import check_out_dir
    from specgen.runtime.private_files import make_private_dir, write_private
    from specgen.simulate.model import program_key
    from specgen.traces.format import Trace

    check(args, plan)
    assert plan.trace_path is not None
    out_dir = Path(args.out) if args.out else Path("specgen-runs") / (
        f"{plan.problem_name}-virtual-{time.strftime('%Y%m%d-%H%M%S')}")
    check_out_dir(out_dir, args.force)
    make_private_dir(out_dir)
    trace = Trace.load(plan.trace_path)
    problem = BenchProblem(plan.problem_name, plan.problem_path.read_text(), trace,
                           plan.problem_name, trace_path=plan.trace_path)
    modes = [args.mode] + (["sequential"] if args.mode != "sequential" else [])
    config = BenchConfig(problems=[problem], modes=modes, fork_model=args.fork_model,
                         timing=TimingModel.from_overrides(args.timing), speed=args.speed,
                         concurrency=1, devices=devices, eval_options=dict(eval_options),
                         target_speedup=args.target_speedup, best_of_n=args.best_of,
                         label="optimize --clock virtual", cache_dir=out_dir.resolve() / "eval-cache")
    config.check()
    if plan.notice:
        say(plan.notice)
    on_cpu = all(d == "cpu" for d in devices)
    say(f"Virtual clock: every program of the trace is validated and profiled for real, once, on "
        f"{', '.join(devices)}" + (" (CPU: C++ kernels run natively; timings are CPU timings)"
                                   if on_cpu else "")
        + f"; then the {args.mode} job and a sequential run of the same trace run on those verdicts "
        f"and service times, the reasoning at "
        + ("the timing model's real pace." if args.speed == 1 else f"{args.speed:g}x the timing "
           "model's pace (not the regime of a real run)."))
    began = time.monotonic()
    summary = run_virtual(config, seed=0, say=say if not args.quiet else (lambda text: None))
    wall_s = time.monotonic() - began
    write_private(out_dir / "virtual.json", json.dumps(summary, indent=2, default=str) + "\n")
    jobs = {j["mode"]: j for j in summary["jobs"]}
    job, sequential = jobs[args.mode], jobs["sequential"]
    kernel = None
    if job.get("best_program") is not None:
        sources = {program_key(s): s for s in programs_in(trace)}
        source = sources.get(job["best_program"])
        if source is not None:
            kernel = out_dir / "best_kernel.py"
            write_private(kernel, source)
    figures = first_run.FirstRunFigures(
        best_kernel=str(kernel) if kernel is not None else None, best_speedup=job["best_speedup"],
        cpu_timing=on_cpu, turn_tokens=job["reasoning_tokens"], read_tokens=job["reasoning_read_tokens"],
        stopped_early=job["reasoning_read_tokens"] < job["reasoning_tokens"],
        run_s=job["end_to_end_s"], generation_s=None, clock="virtual",
        # Fewer than half of the answers judged here (CUDA on a CPU host, say): no comparison.
        sequential_run_s=None if summary["no_headline"] else sequential["end_to_end_s"],
        no_evidence=summary["no_headline"],
        validated=job["validated"], profiled=job["profiled"],
        validated_during=job["validated_during"], profiled_during=job["profiled_during"],
        measured_programs=summary["programs"], measured_wall_s=wall_s)
    say(f"{args.mode}: {job['status']} after {job['end_to_end_s']:.1f} s on the virtual clock "
        f"({summary['programs']} program(s) measured in {wall_s:.1f} s); results: {out_dir}")
    first_run.show(first_run.render(figures), sys.stdout if args.quiet else sys.stderr)
    return 0
