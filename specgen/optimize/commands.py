"""`specgen optimize [PROBLEM.py] [--llm replay|vllm|openai] ...`: run one optimize job.

With no problem and no engine it replays the bundled hand-written trace of a bundled problem, and
says so, with the fork model and timing model it used (replayed reasoning is paced by the timing
model; forks write the latest draft before them unless `--fork-model` says otherwise); the kernels in the trace are validated and profiled for real, on the local GPUs if there
are any, else on CPU workers (Triton under its interpreter, timings labelled CPU timings).
The command is a client of the actor runtime: it starts a local scheduler and node with its
workers, submits the job there (a reasoner process runs the loop and its engine) and follows it into
the run's outputs; `--scheduler ADDR` submits to a running `specgen serve` instead, and
`--evaluation inprocess` runs the loop here with the single-process evaluation backend.

The local cluster is supervised (runtime/local.py): a scheduler or node that dies is started again
and the job goes on from the journal. When it cannot be (setting `cluster_max_restarts`), or the
scheduler stops answering (`scheduler_timeout_s`), the command ends with one line saying what
happened and the `specgen optimize --resume DIR` that continues the run. Following a job of
`--scheduler`, a scheduler that stops answering ends the command the same way (the job stays in
that scheduler's journal).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specgen.errors import UsageError
from specgen.optimize.engine_kinds import ENGINES

if TYPE_CHECKING:
    from specgen.engines.base import Engine
    from specgen.messages import OptimizeResult, OptimizeSpec

# What `--set` may change with --scheduler: the settings of this command's own connection.
CONNECTION_SETTINGS = ("connect_timeout_s", "call_timeout_s", "scheduler_timeout_s")


def register(subparsers: argparse._SubParsersAction) -> None:
    from specgen.optimize.modes import MODES

    parser = subparsers.add_parser(
        "optimize", help="optimize a problem's kernel with a reasoning LLM and speculative forks",
        description="Ask a reasoning LLM for a faster ModelNew; fork candidate kernels from its "
                    "reasoning while it thinks, validate and profile them in parallel, stop when "
                    "one is good enough. With no problem and no engine: a bundled problem replayed "
                    "from its bundled hand-written trace.")
    parser.add_argument("problem", nargs="?",
                        help="KernelBench-format problem file (default: a bundled example)")
    engine = parser.add_argument_group("engine")
    engine.add_argument("--llm", choices=tuple(ENGINES), default=None,
                        help="replay a trace, vLLM in this process, or an OpenAI-compatible server "
                             "(default: replay of the bundled trace)")
    engine.add_argument("--trace", help="trace file to replay (implies --llm replay)")
    engine.add_argument("--speed", type=float, default=1.0,
                        help="replay time scale: 2 replays twice as fast (default 1)")
    from specgen.optimize.fork_models import replayable_fork_models

    engine.add_argument("--fork-model", choices=(*replayable_fork_models(), "scripted"), default="draft",
                        help="what a fork of replayed reasoning writes (optimize/fork_models.py): "
                             "the latest draft before it (draft, the default), the final answer once "
                             "its kernel is named (named, an optimistic bound), or the trace's "
                             "pre-written fork outputs (scripted, a test fixture)")
    engine.add_argument("--timing", action="append", default=[], metavar="NAME=VALUE",
                        help="override the timing model of a replay (r1, knee, beta, prefill_tps, ...)")
    engine.add_argument("--base-url", help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    engine.add_argument("--model", help="model directory (vllm) or served model name (openai)")
    engine.add_argument("--tokenizer", help="tokenizer directory (default: --model for vllm; "
                                            "required for openai)")
    job = parser.add_argument_group("job")
    job.add_argument("--mode", choices=MODES, default="specgen")
    job.add_argument("--time-budget", type=float, default=None, metavar="S",
                     help="wall-time budget in seconds")
    job.add_argument("--token-budget", type=int, default=None, metavar="N",
                     help="budget of reasoning + fork tokens")
    job.add_argument("--max-iterations", type=int, default=None, metavar="N",
                     help="iterations (default 4; a replayed trace: its number of iterations)")
    job.add_argument("--target-speedup", type=float, default=None, metavar="X",
                     help="a correct kernel this much faster than the reference ends the job")
    job.add_argument("--margin", type=float, default=0.1,
                     help="a kernel beating the ones before it by this fraction ends the "
                          "iteration (default 0.1)")
    job.add_argument("--best-of", type=int, default=4, metavar="N",
                     help="reasoning streams per iteration in best-of-n mode (default 4)")
    job.add_argument("--drain-speculative", action="store_true",
                     help="after the last iteration, wait for the speculative candidates still owed a "
                          "verdict instead of cancelling them (they may hold a better kernel)")
    job.add_argument("--fork-max-tokens", type=int, default=4096)
    job.add_argument("--reasoning-max-tokens", type=int, default=32768)
    ablation = parser.add_argument_group("ablations (specgen mode)")
    ablation.add_argument("--no-forking", action="store_true")
    ablation.add_argument("--no-early-termination", action="store_true")
    ablation.add_argument("--no-inline-candidates", action="store_true")
    ablation.add_argument("--no-load-aware", action="store_true")
    ablation.add_argument("--static-pools", action="store_true",
                          help="fixed validation/profiling pools instead of elastic ones")
    evaluation = parser.add_argument_group("evaluation")
    evaluation.add_argument("--evaluation", choices=("runtime", "inprocess"), default="runtime",
                            help="the job in a reasoner of a local scheduler and node, its candidates on their "
                                 "workers (default), or the loop and evaluation in this process")
    evaluation.add_argument("--devices", default=None,
                            help="comma-separated cpu / cuda:N workers (default: every GPU, else "
                                 "one CPU worker per core, at most 4)")
    evaluation.add_argument("--set", dest="runtime_settings", action="append", default=[],
                            metavar="NAME=VALUE",
                            help="a runtime setting for the local scheduler and node (e.g. "
                                 "peer_timeout_s=30 on a heavily loaded machine; with --scheduler "
                                 f"only this command's connection: {', '.join(CONNECTION_SETTINGS)}); "
                                 "repeatable")
    evaluation.add_argument("--kv-pool", choices=("auto", "off", "host", "gpus"), default="auto",
                            help="with --llm vllm: keep the reasoning's KV blocks in a remote pool "
                                 "forks load instead of recomputing: in spare memory of a profiling "
                                 "GPU (gpus), in host memory (host); auto: gpus where a GPU besides "
                                 "the inference GPU evaluates, else host")
    evaluation.add_argument("--kv-pool-gib", type=float, default=4.0, metavar="GIB",
                            help="the KV pool's size (default 4)")
    evaluation.add_argument("--trials", type=int, default=None,
                            help="correctness trials per candidate (evaluation default 5)")
    evaluation.add_argument("--timing-trials", type=int, default=None,
                            help="timed calls per model (evaluation default 50)")
    evaluation.add_argument("--eval-timeout", type=float, default=None, metavar="S",
                            help="wall seconds one candidate's run may take (evaluation default 300)")
    remote = parser.add_argument_group("cluster")
    remote.add_argument("--scheduler", default=None, metavar="ADDR",
                        help="submit the job to a running `specgen serve` (e.g. tcp://host:5555) and "
                             "follow it, instead of starting a local cluster")
    remote.add_argument("--keys", type=Path, default=None, metavar="DIR",
                        help="CURVE client keys for --scheduler off loopback (see `specgen keys`)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="output directory (default: specgen-runs/PROBLEM-MODE-TIME); it must "
                             "be empty or new, unless --force")
    parser.add_argument("--force", action="store_true",
                        help="write into a non-empty --out, replacing an earlier run's files")
    parser.add_argument("--resume", default=None, metavar="DIR",
                        help="continue the killed run in DIR with its own settings (other options "
                             "but --quiet are not read): completed iterations stand, the one in "
                             "progress runs again from its start, and no candidate is evaluated "
                             "twice")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.set_defaults(func=run_optimize)


# ---------------------------------------------------------------------------------- choices

@dataclass
class _Plan:
    """What a command line resolves to, before anything starts."""

    problem_path: Path = Path()
    problem_name: str = ""
    llm: str = ""
    trace_path: Path | None = None
    notice: str = ""                           # said before the run, e.g. that a trace is replayed


def _plan(args: argparse.Namespace, gpu: bool | None = None) -> _Plan:
    """`gpu`: whether this host has a GPU (None: look), which picks the bundled default run."""
    from specgen.traces.bundled import DEFAULT_PROBLEM, bundled_problem, bundled_trace, default_run

    plan = _Plan()
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
            name, default_trace = default_run(_host_has_gpu() if gpu is None else gpu)
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


def _kv_plan(plan: _Plan, args: argparse.Namespace, devices: list[str]):
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


def _make_engine(plan: _Plan, args: argparse.Namespace) -> Engine:
    """The engine of this process's run: the same description a scheduler job carries
    (`_engine_options`), built by the same registry (`engine_kinds`)."""
    from specgen.optimize.engine_kinds import build_engine

    return build_engine(_engine_options(plan, args), plan.problem_name, where="the engine")


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def _host_has_gpu() -> bool:
    return _gpu_count() > 0


def _default_devices() -> list[str]:
    gpus = _gpu_count()
    if gpus:
        return [f"cuda:{i}" for i in range(gpus)]
    return ["cpu"] * max(1, min(4, os.cpu_count() or 1))


def _devices(args: argparse.Namespace) -> list[str]:
    if not args.devices:
        return _default_devices()
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    for device in devices:
        if device != "cpu" and not (device.startswith("cuda:") and device[5:].isdigit()):
            raise UsageError(f"--devices: {device!r} is neither cpu nor cuda:N")
    if not devices:
        raise UsageError("--devices names no device")
    return devices


@contextlib.asynccontextmanager
async def local_cluster(devices: list[str], *, elastic: bool, eval_options: dict[str, Any],
                        runtime_settings: list[str] = (), kv_control: bool = False,
                        state_dir: Path | None = None) -> AsyncIterator[Any]:
    """A scheduler and a node over `devices` on this machine, up for the duration of the block;
    `cluster.backend()` gives each job a backend of its own (several jobs share the cluster).
    `state_dir` keeps the scheduler's journal (default: a temporary directory, gone after)."""
    from specgen.runtime.local import LocalCluster
    from specgen.runtime.settings import RuntimeSettings

    settings = RuntimeSettings(pool_mode="elastic" if elastic else "static",
                               eval_options=dict(eval_options))
    settings = settings.with_overrides(list(runtime_settings))
    cluster = LocalCluster(devices=devices, settings=settings, kv_control=kv_control,
                           state_dir=state_dir, supervise=True)
    await asyncio.to_thread(cluster.start)
    try:
        yield cluster
    finally:
        await asyncio.to_thread(cluster.stop)


@contextlib.asynccontextmanager
async def evaluation_backend(kind: str, devices: list[str], *, elastic: bool,
                             eval_options: dict[str, Any], runtime_settings: list[str] = (),
                             on_kv_control: Callable[[str | None], None] | None = None,
                             state_dir: Path | None = None) -> AsyncIterator[Any]:
    """An EvaluationBackend over `devices`, up for the duration of the block.

    `runtime_settings` are `NAME=VALUE` overrides of the local runtime's settings. With
    `on_kv_control`, the scheduler opens its KV pools' control channel and the callback gets its
    endpoint before the block runs (None for in-process evaluation: no scheduler). `state_dir`:
    where the local scheduler keeps its journal (in-process evaluation has none)."""
    if kind == "runtime":
        async with local_cluster(devices, elastic=elastic, eval_options=eval_options,
                                 runtime_settings=runtime_settings,
                                 kv_control=on_kv_control is not None,
                                 state_dir=state_dir) as cluster:
            if on_kv_control is not None:
                on_kv_control(cluster.kv_control_endpoint)
            yield cluster.backend()
        return
    if on_kv_control is not None:
        on_kv_control(None)
    from specgen.eval.evaluator import EvalWorker
    from specgen.eval.local_backend import LocalEvaluationBackend
    from specgen.eval.options import EvalOptions

    with tempfile.TemporaryDirectory(prefix="specgen-optimize-") as scratch:
        workers = [EvalWorker(device=device, work_dir=Path(scratch) / f"worker{i}",
                              options=EvalOptions(**eval_options), name=f"inprocess/{device}#{i}")
                   for i, device in enumerate(devices)]
        try:
            for worker in workers:
                await asyncio.to_thread(worker.start)
            backend = LocalEvaluationBackend(workers)
            try:
                yield backend
            finally:
                await backend.close()
        finally:
            for worker in workers:
                worker.close()


# ---------------------------------------------------------------------------------- running

def _spec(plan: _Plan, args: argparse.Namespace, engine: Engine) -> OptimizeSpec:
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


_NOT_SAVED = ("func", "resume", "force", "quiet")


def _saved_options(args: argparse.Namespace) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
            if k not in _NOT_SAVED}


def _resumed_args(args: argparse.Namespace) -> tuple[argparse.Namespace, OptimizeSpec] | None:
    """The settings of the run in `args.resume` (None when it has finished: said, nothing to do)."""
    import msgspec

    from specgen.messages import OptimizeResult
    from specgen.optimize.outputs import read_run_settings

    run_dir = Path(args.resume)
    options, spec = read_run_settings(run_dir)
    result_path = run_dir / "result.json"
    if result_path.is_file():
        try:
            result = msgspec.json.decode(result_path.read_bytes(), type=OptimizeResult)
            how = f"{result.status}: {result.stop_reason}"
        except (msgspec.DecodeError, msgspec.ValidationError):
            how = "its result.json is there"
        print(f"The run in {run_dir} is finished ({how}); nothing to resume.")
        return None
    if options.get("scheduler"):
        raise UsageError(f"the run in {run_dir} was a job of the scheduler at {options['scheduler']}: "
                         f"it lives in that scheduler's journal (follow it there), not in {run_dir}")
    resumed = argparse.Namespace(**options)
    if resumed.keys is not None:
        resumed.keys = Path(resumed.keys)
    resumed.out, resumed.force, resumed.quiet, resumed.resume = str(run_dir), False, args.quiet, args.resume
    resumed.func = args.func
    return resumed, spec


def run_optimize(args: argparse.Namespace) -> int:
    from specgen.messages import OptimizeEvent
    from specgen.optimize.loop import run_job
    from specgen.optimize.modes import Mechanisms, check_spec
    from specgen.optimize.outputs import (
        JOURNAL_DIR, SCHEDULER_STATE, LoopJournal, ResumedRun, RunWriter, check_out_dir,
        clear_run_files, write_run_settings,
    )
    from specgen.optimize.progress import ProgressDisplay
    from specgen.runtime.transport import RuntimeFailure

    resumed_spec = None
    if args.resume:
        found = _resumed_args(args)
        if found is None:
            return 0
        args, resumed_spec = found
    # Everything the command line can get wrong is checked before anything is said or started.
    plan = _plan(args)
    devices = _devices(args)
    if plan.llm == "vllm" and not args.devices and len(devices) > 1 and devices[0] == "cuda:0":
        # vLLM runs on cuda:0: it evaluates only when asked for (--devices), so that profiling
        # timings never share a GPU with the reasoning
        devices = devices[1:]
    eval_options: dict[str, Any] = {}
    for flag, least in (("trials", 1), ("timing_trials", 2)):
        value = getattr(args, flag)
        if value is not None:
            if value < least:
                raise UsageError(f"--{flag.replace('_', '-')} must be at least {least}, got {value}")
            eval_options[flag] = value
    eval_timeout = getattr(args, "eval_timeout", None)    # absent from runs saved before it existed
    if eval_timeout is not None:
        if not eval_timeout > 0:
            raise UsageError(f"--eval-timeout must be more than 0 seconds, got {eval_timeout}")
        eval_options["timeout_s"] = eval_timeout
    if args.runtime_settings:
        from specgen.runtime.settings import RuntimeSettings

        RuntimeSettings().with_overrides(args.runtime_settings)
    if args.out and not args.resume:
        check_out_dir(Path(args.out), args.force)   # before an engine loads a model
    if args.scheduler:
        names = [pair.partition("=")[0] for pair in args.runtime_settings]
        cluster_settings = [name for name in names if name not in CONNECTION_SETTINGS]
        evaluation_flags = [f for f, key in (("--trials", "trials"), ("--timing-trials", "timing_trials"),
                                             ("--eval-timeout", "timeout_s")) if key in eval_options]
        for flag, given in (("--devices", args.devices), ("--evaluation inprocess", args.evaluation == "inprocess"),
                            (f"--set {', '.join(cluster_settings)}", cluster_settings),
                            (" and ".join(evaluation_flags), evaluation_flags)):
            if given:
                raise UsageError(f"{flag} cannot go with --scheduler: the cluster's scheduler and "
                                 f"nodes decide where and how evaluations run (--set takes only this "
                                 f"command's connection settings there: {', '.join(CONNECTION_SETTINGS)}; "
                                 f"a node's evaluation options are its own `--set eval_options=...`)")
    # With --scheduler the job's reasoner places the pool (--kv-pool goes with the job's options).
    kv_plan = _kv_plan(plan, args, devices)
    # The job runs in a reasoner (of the embedded cluster, or of --scheduler's) unless evaluation is
    # in this process; a reasoner makes its own engine, and only a replayed trace is opened here
    # too, for its number of iterations.
    in_reasoner = bool(args.scheduler) or args.evaluation != "inprocess"
    engine = None if in_reasoner and plan.llm != "replay" else _make_engine(plan, args)
    spec = resumed_spec if resumed_spec is not None else _spec(plan, args, engine)
    check_spec(spec)

    out_dir = Path(args.out) if args.out else Path("specgen-runs") / spec.job_id
    if not args.resume:
        check_out_dir(out_dir, args.force)
        if args.force:
            clear_run_files(out_dir)   # one folder, one run: nothing of the earlier one stays
        write_run_settings(out_dir, _saved_options(args), spec)
    # A job in a reasoner replays its whole event stream to its follower: the file starts afresh.
    writer = RunWriter(out_dir, append=bool(args.resume) and not in_reasoner)
    display = None if args.quiet else ProgressDisplay(sys.stderr)
    say = (lambda text: None) if args.quiet else (lambda text: print(text, file=sys.stderr))
    if plan.notice:
        say(plan.notice)
    resume = None
    if args.resume:
        # The embedded cluster's reasoner journals the loop in the job's folder of the run's
        # scheduler state; the in-process loop journals in the run's own folder.
        resume = ResumedRun.read(out_dir / JOURNAL_DIR / SCHEDULER_STATE / "jobs" / spec.job_id
                                 if in_reasoner else out_dir)
        say(f"Resuming {spec.job_id} in {out_dir}: {len(resume.iterations)} iteration(s) done, "
            f"{len(resume.candidates)} candidate(s) and {len(resume.updates)} verdict(s) "
            f"journaled; iteration {len(resume.iterations) + 1} runs again from its start, "
            f"and the wall-time budget starts again.")

    def emit(event: OptimizeEvent) -> None:
        writer(event)
        if display is not None:
            display(event)

    def finish(run: Callable[[], OptimizeResult]) -> int:
        try:
            result = run()
        finally:
            writer.close()
            journal.close()
            if display is not None:
                display.close()
        written = writer.finish(result)
        _summary(result, written, say if not args.quiet else (lambda text: print(text)))
        _closing_screen(result, written, plan, args, devices, eval_options, say,
                        sys.stdout if args.quiet else sys.stderr)
        return 0 if result.status != "failed" else 1

    journal = LoopJournal(out_dir)
    if args.scheduler:
        journal.close()   # the scheduler's journal holds this job
        return finish(lambda: _submit(args, plan, spec, emit, say))
    on_cpu = all(d == "cpu" for d in devices)
    say(f"Evaluating on {len(devices)} worker(s): {', '.join(devices)}"
        + (" (CPU: C++ kernels run natively, Triton under its interpreter; timings are CPU "
           "timings)" if on_cpu else ""))
    if in_reasoner:
        journal.close()   # the job's reasoner journals the loop in the cluster's state

        async def in_cluster() -> OptimizeResult:
            async with local_cluster(devices, elastic=Mechanisms.of(spec).elastic_pools,
                                     eval_options=eval_options, runtime_settings=args.runtime_settings or [],
                                     kv_control=kv_plan.on, state_dir=out_dir / JOURNAL_DIR / SCHEDULER_STATE,
                                     ) as cluster:
                live = None
                if kv_plan.on and display is not None:
                    from specgen.optimize.kv_pool import LiveKvStats

                    live = display.kv_pool = LiveKvStats(cluster, None)
                try:
                    return await asyncio.to_thread(_follow, cluster.client, args, plan, spec, emit, say,
                                                   existing=bool(args.resume))
                except RuntimeFailure as exc:
                    # The job is journaled in the run's folder: say what stopped it, and how to go on.
                    raise RuntimeFailure(f"{cluster.failure or exc}; continue the run with: specgen "
                                         f"optimize --resume {shlex.quote(str(out_dir))}") from None
                finally:
                    if live is not None:
                        display.kv_pool = None
                        live.close()

        return finish(lambda: asyncio.run(in_cluster()))

    async def main() -> OptimizeResult:
        elastic = Mechanisms.of(spec).elastic_pools
        pool_id = ""

        def attach_kv_pool(endpoint: str | None) -> None:
            nonlocal pool_id
            from specgen.optimize import kv_pool

            notice, pool_id = kv_pool.attach(engine, kv_plan, endpoint)
            say(notice)

        async with evaluation_backend(args.evaluation, devices, elastic=elastic,
                                      eval_options=eval_options,
                                      runtime_settings=args.runtime_settings,
                                      on_kv_control=attach_kv_pool if kv_plan.on else None,
                                      state_dir=out_dir / JOURNAL_DIR / SCHEDULER_STATE,
                                      ) as backend:
            live = None
            if pool_id and display is not None:
                from specgen.optimize.kv_pool import LiveKvStats

                live = LiveKvStats(backend, pool_id)
                display.kv_pool = live
            try:
                result = await run_job(spec, engine, backend, emit, journal=journal, resume=resume)
                if pool_id:
                    from specgen.optimize.kv_pool import final_stats

                    result.kv_pool = await asyncio.to_thread(final_stats, backend, pool_id, settle_s=0.3)
                return result
            finally:
                if live is not None:
                    display.kv_pool = None
                    live.close()
                await engine.close()

    return finish(lambda: asyncio.run(main()))


def _engine_options(plan: _Plan, args: argparse.Namespace) -> dict[str, Any]:
    """The job's `options["engine"]` (optimize/job.py): what its reasoner generates with. Paths
    are read where the scheduler runs the reasoner."""
    if plan.llm == "replay":
        assert plan.trace_path is not None
        options = {"llm": "replay", "trace": str(plan.trace_path.resolve()), "speed": args.speed,
                   "fork_model": args.fork_model, "timing": list(args.timing or [])}
    elif plan.llm == "vllm":
        options = {"llm": "vllm", "model": str(Path(args.model).resolve()), "kv_pool": args.kv_pool,
                   "kv_pool_gib": args.kv_pool_gib}
    else:
        # Any other registered engine (openai among them): the flags it has keys for.
        given = {"base_url": args.base_url, "model": args.model}
        options = {"llm": plan.llm, **{k: v for k, v in given.items()
                                       if v is not None and k in ENGINES[plan.llm].keys}}
    if args.tokenizer:
        options["tokenizer"] = args.tokenizer
    return options


def _submit(args: argparse.Namespace, plan: _Plan, spec: OptimizeSpec,
            emit: Callable[[Any], None], say: Callable[[str], None]) -> OptimizeResult:
    """Run the job on a running `specgen serve` (its reasoner and evaluations run in the cluster)
    and follow it: a Ctrl-C here cancels the job; a crash of this process leaves it running
    there, and its events and result stay in the scheduler's journal; a scheduler silent for the
    setting scheduler_timeout_s ends the following, not the job."""
    from specgen.runtime.client import Client
    from specgen.runtime.settings import RuntimeSettings
    from specgen.runtime.transport import SchedulerUnreachable

    settings = RuntimeSettings().with_overrides(list(args.runtime_settings or []))
    with Client(args.scheduler, keys=args.keys, settings=settings) as client:
        try:
            return _follow(client, args, plan, spec, emit, say, where=f"the scheduler at {args.scheduler}")
        except SchedulerUnreachable as exc:
            # Raised by the wait on the job's events or result: the scheduler had taken the job.
            raise SchedulerUnreachable(f"{exc}; job {spec.job_id} stays in that scheduler's journal "
                                       f"and goes on when it is back") from None


def _follow(client: Any, args: argparse.Namespace, plan: _Plan, spec: OptimizeSpec,
            emit: Callable[[Any], None], say: Callable[[str], None], *, existing: bool = False,
            where: str = "") -> OptimizeResult:
    """Submit the job to `client`'s scheduler (or, `existing`, follow the one it already runs: a
    resumed run) and turn its events and result into the loop's, for the run's outputs."""
    import msgspec

    from specgen.messages import JobSpec
    from specgen.optimize.job import (
        ENGINE_OPTION, ENTRY, NOTICE_EVENT, SCHEDULER_EVENTS, optimize_event, optimize_result,
    )

    if existing:
        job = client.job(spec.job_id)
    else:
        options = msgspec.to_builtins(spec)
        for key in ("job_id", "problem_name", "problem_source"):
            options.pop(key, None)
        options[ENGINE_OPTION] = _engine_options(plan, args)
        # The loop ends itself at its time budget; the scheduler's deadline (plus job_grace_s)
        # stops a job whose reasoner does not.
        job = client.submit(JobSpec(job_id=spec.job_id, problem_name=spec.problem_name,
                                    problem_source=spec.problem_source, entry=ENTRY, options=options,
                                    wall_time_s=spec.time_budget_s))
        if where:
            say(f"Submitted job {spec.job_id} to {where}.")
    try:
        for event in job.events():
            if event.kind == "reasoner_started" and where:
                say(f"  reasoner started (attempt {event.data.get('attempt')})")
            elif event.kind == NOTICE_EVENT:
                say(str(event.data.get("text", "")))
            elif event.kind not in SCHEDULER_EVENTS:
                emit(optimize_event(event))
        return optimize_result(job.result())
    except KeyboardInterrupt:
        job.cancel()
        raise


def _closing_screen(result: OptimizeResult, written: dict[str, Path], plan: _Plan,
                    args: argparse.Namespace, devices: list[str], eval_options: dict[str, Any],
                    say: Callable[[str], None], stream: Any) -> None:
    """The first-run screen (specgen/optimize/first_run.py): the best kernel, how much reasoning
    was stopped, and this run against a sequential run of the same trace on the virtual clock."""
    from specgen.optimize import first_run

    if result.status == "cancelled":
        return
    trace = timing = None
    if plan.llm == "replay" and plan.trace_path is not None and args.fork_model != "scripted":
        from specgen.engines.timing_model import TimingModel
        from specgen.traces.format import Trace

        trace = Trace.load(plan.trace_path)
        timing = TimingModel.from_overrides(args.timing)
    measured: dict[int, float | None] = {}
    if trace is not None and result.status == "target_reached":
        # Stopped early because a kernel was good enough: what sequential would have waited for
        # includes judging the answer this run never wrote. (A run cut by a budget saved nothing
        # by speculation; its sequential figure stays unmeasured.)
        programs = first_run.unevaluated_answers(result, trace)
        if programs:
            say(f"The run stopped the reasoning before its answer: evaluating the trace's answer "
                f"once on {devices[0]}, for the sequential figure ...")
            measured = first_run.measure_answers(programs, plan.problem_name,
                                                 plan.problem_path.read_text(), devices[0],
                                                 eval_options)
    figures = first_run.figures(result, trace, timing, speed=args.speed,
                                best_kernel=written.get("best_kernel"), measured_after=measured)
    first_run.show(first_run.render(figures), stream)


def _summary(result: OptimizeResult, written: dict[str, Path],
             say: Callable[[str], None]) -> None:
    metrics = result.metrics
    best = (f"{result.best_speedup:.3g}x ({result.best_candidate_id}"
            + (", CPU timing" if result.cpu_timing else "") + ")"
            if result.best_speedup is not None else "no correct kernel")
    say(f"{result.mode}: {result.status} ({result.stop_reason}) after {metrics.end_to_end_s:.1f} s")
    say(f"  best: {best}; {metrics.iterations} iteration(s), {metrics.total_tokens:,} tokens "
        f"({metrics.reasoning_tokens:,} reasoning + {metrics.fork_tokens:,} fork), "
        f"{metrics.forks} forks, {metrics.candidates} candidates (+{metrics.duplicates} "
        f"duplicate{'' if metrics.duplicates == 1 else 's'} not evaluated), "
        f"{metrics.validated} validated, {metrics.profiled} profiled")
    if result.kv_pool is not None:
        kv = result.kv_pool
        say(f"  KV pool: {kv.stores} blocks stored, {kv.loads} loaded back, hit rate "
            f"{kv.hit_rate:.0%} ({kv.hits} hits, {kv.misses} misses), {kv.evictions} evicted, "
            f"{kv.used_bytes / (1 << 20):.0f} of {kv.capacity_bytes / (1 << 20):.0f} MiB used")
    if result.error:
        say(f"  error: {result.error}")
    for name, path in written.items():
        say(f"  {name}: {path}")
