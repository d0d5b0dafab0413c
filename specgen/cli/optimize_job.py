"""The job `specgen optimize`'s flags describe, built once: what runs (the plan), where it is
evaluated (the devices), and the typed `JobConfig` it submits (optimize/job.py).

Everything the command line can get wrong is checked here, before anything starts: a missing
problem or trace, flags that cannot go together, budgets and evaluation options out of range.
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from specgen.errors import UsageError
from specgen.optimize.engine_kinds import ENGINES

if TYPE_CHECKING:
    from specgen.engines.base import Engine
    from specgen.messages import OptimizeSpec
    from specgen.optimize.job import JobConfig

# What `--set` may change with --scheduler: the settings of this command's own connection.
CONNECTION_SETTINGS = ("connect_timeout_s", "call_timeout_s", "scheduler_timeout_s")


@dataclass
class Plan:
    """What a command line resolves to, before anything starts."""

    problem_path: Path = Path()
    problem_name: str = ""
    llm: str = ""
    trace_path: Path | None = None
    notice: str = ""                           # said before the run, e.g. that a trace is replayed


def plan_run(args: argparse.Namespace, gpu: bool | None = None) -> Plan:
    """`gpu`: whether this host has a GPU (None: look), which picks the bundled default run."""
    from specgen.traces.bundled import DEFAULT_PROBLEM, bundled_problem, bundled_trace, default_run

    plan = Plan()
    if args.trace and args.llm not in (None, "replay"):
        raise UsageError(f"--trace replays a recorded trace; it cannot go with --llm {args.llm}")
    llm = "replay" if args.trace else args.llm
    default_trace = None
    if args.problem is None:
        if llm not in (None, "replay"):
            raise UsageError(f"--llm {llm} needs a PROBLEM.py to optimize")
        name = DEFAULT_PROBLEM
        if not args.trace:
            # The first run: a hand-written Triton trace on a GPU host; on a CPU-only host a
            # generated trace of a problem whose C++ kernels run natively.
            name, default_trace = default_run(host_has_gpu() if gpu is None else gpu)
        plan.problem_path = bundled_problem(name)
    else:
        plan.problem_path = Path(args.problem)
        if not plan.problem_path.is_file():
            raise UsageError(f"problem file {args.problem} not found")
    plan.problem_name = plan.problem_path.stem
    plan.llm = llm or "replay"
    if plan.llm == "replay":
        if args.trace:
            plan.trace_path = Path(args.trace)
            if not plan.trace_path.is_file():
                raise UsageError(f"trace file {args.trace} not found")
        else:
            plan.trace_path = default_trace or bundled_trace(plan.problem_name)
            if plan.trace_path is None or not plan.trace_path.is_file():
                raise UsageError(
                    f"no engine configured and no bundled trace for {plan.problem_name}: pass "
                    f"--llm vllm --model DIR, --llm openai --base-url URL --model NAME "
                    f"--tokenizer DIR, or --trace FILE")
            what = "bundled problem" if args.problem is None else "problem"
            from specgen.traces.bundled import GENERATED_TRACES_DIR

            generated = plan.trace_path.parent == GENERATED_TRACES_DIR
            kind = ("generated (tools/make_traces.py --generated, seed 0)" if generated
                    else "hand-written")
            plan.notice = (f"No engine configured: replaying the bundled {kind} trace "
                           f"{plan.trace_path.name} for the {what} {plan.problem_name} "
                           f"(--llm vllm|openai runs a live model).")
        if args.fork_model == "scripted":
            plan.notice += (" Forks: the trace's pre-written outputs (a test fixture, no evidence "
                            "of anything); timing: the trace's recorded times.")
        else:
            from specgen.engines.timing_model import TimingModel

            timing = TimingModel.from_overrides(args.timing)
            plan.notice += (f" Forks: fork model '{args.fork_model}'; timing: {timing.r1:g} "
                            f"tokens/s per request up to {timing.knee:g} sequences, falling as "
                            f"(knee/n)^{timing.beta:g} beyond, prefill {timing.prefill_tps:g} "
                            f"tokens/s ({timing.source}).")
    elif plan.llm == "vllm":
        if not args.model:
            raise UsageError("--llm vllm needs --model DIR (a local model directory)")
    elif plan.llm == "openai":
        missing = [flag for flag, value in (("--base-url", args.base_url), ("--model", args.model),
                                            ("--tokenizer", args.tokenizer)) if not value]
        if missing:
            raise UsageError(f"--llm openai needs {', '.join(missing)}")
    return plan


def kv_pool_plan(plan: Plan, args: argparse.Namespace, devices: list[str]):
    """Where the KV pool goes: only a vLLM engine can use one; with --scheduler, the job's reasoner
    places it (kv_pool.attach_in_cluster)."""
    from specgen.kv.engine_config import KvPoolPlan, plan_kv_pool

    if plan.llm != "vllm":
        if args.kv_pool in ("host", "gpus"):
            raise UsageError(f"--kv-pool {args.kv_pool} needs --llm vllm (the pool plugs into "
                             f"vLLM's KV offloading); this run's engine is {plan.llm}")
        return KvPoolPlan("", 0, f"no vLLM engine in this process ({plan.llm})")
    if args.scheduler:
        if not args.kv_pool_gib > 0:
            raise UsageError(f"--kv-pool-gib must be > 0, got {args.kv_pool_gib}")
        return KvPoolPlan("", 0, "placed by the job's reasoner in the cluster")
    return plan_kv_pool(args.kv_pool, devices, pool_gib=args.kv_pool_gib)


def make_engine(plan: Plan, args: argparse.Namespace) -> Engine:
    """The engine of this process's run: the same description a scheduler job carries
    (`engine_spec_of`), built by the same registry (`engine_kinds`)."""
    from specgen.optimize.engine_kinds import build_engine

    return build_engine(engine_spec_of(plan, args), plan.problem_name, where="the engine")


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def host_has_gpu() -> bool:
    return gpu_count() > 0


def default_devices() -> list[str]:
    gpus = gpu_count()
    if gpus:
        return [f"cuda:{i}" for i in range(gpus)]
    return ["cpu"] * max(1, min(4, os.cpu_count() or 1))


def devices_of(args: argparse.Namespace) -> list[str]:
    if not args.devices:
        return default_devices()
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    for device in devices:
        if device != "cpu" and not (device.startswith("cuda:") and device[5:].isdigit()):
            raise UsageError(f"--devices: {device!r} is neither cpu nor cuda:N")
    if not devices:
        raise UsageError("--devices names no device")
    return devices


def job_config(plan: Plan, args: argparse.Namespace, engine: Engine | None,
               resumed: OptimizeSpec | None = None) -> JobConfig:
    """The job the command line describes, typed and checked (`resumed`: the optimize spec of the
    run `--resume` continues). Built once; it reaches the job's reasoner as its JobSpec."""
    from specgen.optimize.job import JobConfig
    from specgen.optimize.modes import check_spec

    spec = resumed if resumed is not None else optimize_spec(plan, args, engine)
    check_spec(spec)
    return JobConfig(optimize=spec, engine=engine_spec_of(plan, args))


def optimize_spec(plan: Plan, args: argparse.Namespace, engine: Engine | None) -> OptimizeSpec:
    from specgen.messages import OptimizeSpec

    max_iterations = args.max_iterations
    if max_iterations is None:
        trace = getattr(engine, "trace", None)
        max_iterations = len(trace.iterations) if trace is not None else 4
    from specgen.runtime.ids import new_id

    stamp = time.strftime("%Y%m%d-%H%M%S")
    return OptimizeSpec(
        # Readable, and unguessable by its random end (runtime/ids.py): a job id on a shared
        # scheduler is no one else's to aim at.
        job_id=new_id(f"{plan.problem_name}-{args.mode}-{stamp}"),
        problem_name=plan.problem_name,
        problem_source=plan.problem_path.read_text(),
        mode=args.mode,
        time_budget_s=args.time_budget,
        token_budget=args.token_budget,
        max_iterations=max_iterations,
        target_speedup=args.target_speedup,
        improvement_margin=args.margin,
        best_of_n=args.best_of,
        drain_speculative=getattr(args, "drain_speculative", False),   # absent from older runs' settings
        fork_max_tokens=args.fork_max_tokens,
        reasoning_max_tokens=args.reasoning_max_tokens,
        forking=not args.no_forking,
        early_termination=not args.no_early_termination,
        inline_candidates=not args.no_inline_candidates,
        load_aware=not args.no_load_aware,
        elastic_pools=not args.static_pools,
    )


# Every command-line flag that sets an evaluation option, in one place: (flag, the Namespace's
# attribute, EvalOptions' field, the check its value must pass, said as words). `optimize`, a
# suite and `bench` read them through eval_options_of; check_remote_flags names them.
EVAL_FLAGS: tuple[tuple[str, str, str, Callable[[float], bool], str], ...] = (
    ("--trials", "trials", "trials", lambda v: v >= 1, "at least 1"),
    ("--timing-trials", "timing_trials", "timing_trials", lambda v: v >= 2, "at least 2"),
    ("--eval-timeout", "eval_timeout", "timeout_s", lambda v: v > 0, "more than 0 seconds"),
)


def eval_options_of(args: argparse.Namespace) -> dict[str, Any]:
    """The evaluation options the command line sets (EvalOptions' field names), checked. A
    command without one of the flags (or a run saved before it existed) sets nothing for it."""
    eval_options: dict[str, Any] = {}
    for flag, attribute, field, valid, wanted in EVAL_FLAGS:
        value = getattr(args, attribute, None)
        if value is None:
            continue
        if not valid(value):
            raise UsageError(f"{flag} must be {wanted}, got {value}")
        eval_options[field] = value
    return eval_options


def check_remote_flags(args: argparse.Namespace, eval_options: dict[str, Any]) -> None:
    """What --scheduler cannot go with: the cluster's scheduler and nodes decide where and how
    evaluations run."""
    names = [pair.partition("=")[0] for pair in args.runtime_settings]
    cluster_settings = [name for name in names if name not in CONNECTION_SETTINGS]
    evaluation_flags = [flag for flag, _, field, _, _ in EVAL_FLAGS if field in eval_options]
    for flag, given in (("--devices", args.devices), ("--evaluation inprocess", args.evaluation == "inprocess"),
                        (f"--set {', '.join(cluster_settings)}", cluster_settings),
                        (" and ".join(evaluation_flags), evaluation_flags)):
        if given:
            raise UsageError(f"{flag} cannot go with --scheduler: the cluster's scheduler and "
                             f"nodes decide where and how evaluations run (--set takes only this "
                             f"command's connection settings there: {', '.join(CONNECTION_SETTINGS)}; "
                             f"a node's evaluation options are its own `--set eval_options=...`)")


def engine_spec_of(plan: Plan, args: argparse.Namespace) -> Any:
    """The job's engine (an `engine_kinds.EngineSpec`, its `options["engine"]`): what its
    reasoner generates with. Paths are read where the scheduler runs the reasoner."""
    from specgen.optimize.engine_kinds import engine_spec

    if plan.llm == "replay":
        assert plan.trace_path is not None
        raw = {"trace": str(plan.trace_path.resolve()), "speed": args.speed,
               "fork_model": args.fork_model, "timing": list(args.timing or [])}
    elif plan.llm == "vllm":
        raw = {"model": str(Path(args.model).resolve()), "kv_pool": args.kv_pool,
               "kv_pool_gib": args.kv_pool_gib}
    else:
        # Any other registered engine (openai among them): the flags its spec has fields for.
        given = {"base_url": args.base_url, "model": args.model}
        raw = {k: v for k, v in given.items() if v is not None and k in ENGINES[plan.llm].keys}
    if args.tokenizer:
        raw["tokenizer"] = args.tokenizer
    return engine_spec({"llm": plan.llm, **raw}, where="the engine")
