"""`specgen optimize [PROBLEM.py] [--llm replay|vllm|openai] ...`: run one optimize job.

With no problem and no engine it replays the bundled hand-written trace of a bundled problem, and
says so, with the fork model and timing model it used (replayed reasoning is paced by the timing
model; forks write the latest draft before them unless `--fork-model` says otherwise); the kernels in the trace are validated and profiled for real, on the local GPUs if there
are any, else on CPU workers (Triton under its interpreter, timings labelled CPU timings).
The command is a client of the actor runtime, whichever scheduler serves it (runtime/connect.py):
it starts a local scheduler and node with its workers, submits the job there (a reasoner process
runs the loop and its engine) and follows it into the run's outputs; `--scheduler ADDR` submits to
a running `specgen serve` instead, and `--evaluation inprocess` runs the same scheduler core, its
workers and the job's loop in this process. The run path is one: build the job, connect, submit,
follow.

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
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specgen.cli.optimize_job import (
    CONNECTION_SETTINGS, Plan, check_remote_flags, devices_of, eval_options_of, job_config, kv_pool_plan, make_engine, plan_run,
)
from specgen.errors import UsageError
from specgen.optimize.engine_kinds import ENGINES

if TYPE_CHECKING:
    from specgen.engines.base import Engine
    from specgen.messages import OptimizeResult, OptimizeSpec
    from specgen.optimize.job import JobConfig



def register(subparsers: argparse._SubParsersAction) -> None:
    from specgen.optimize.modes import MODES

    parser = subparsers.add_parser(
        "optimize", help="optimize a problem's kernel with a reasoning LLM and speculative forks",
        description="Ask a reasoning LLM for a faster ModelNew; fork candidate kernels from its "
                    "reasoning while it thinks, validate and profile them in parallel, stop when "
                    "one is good enough. With no problem and no engine: a bundled problem replayed "
                    "from its bundled hand-written trace.")
    parser.add_argument("problem", nargs="*",
                        help="KernelBench-format problem file (default: a bundled example); several "
                             "files, a folder or a glob run a suite (cli/suite.py)")
    engine = parser.add_argument_group("engine")
    engine.add_argument("--llm", choices=tuple(ENGINES), default=None,
                        help="replay a trace, vLLM in this process, or an OpenAI-compatible server "
                             "(default: replay of the bundled trace)")
    engine.add_argument("--trace", help="trace file to replay (implies --llm replay)")
    engine.add_argument("--clock", choices=("wall", "virtual"), default=None,
                        help="virtual: evaluate the trace's programs once for real, then run the job "
                             "and a sequential run of the trace on a virtual clock (minutes, not the "
                             "reasoning's length; cli/optimize_virtual.py); wall: the runtime at the "
                             "reasoning's pace (default, except for the first run: no problem, no "
                             "engine)")
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
    evaluation.add_argument("--evaluation", choices=("runtime", "inprocess"), default=None,
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
    suite = parser.add_argument_group("suite (several problems, a folder or a glob; docs/optimize.md, \"Suites\")")
    suite.add_argument("--modes", default=None, metavar="A,B",
                       help=f"modes to run side by side, comma-separated ({', '.join(MODES)}; "
                            "default: --mode)")
    suite.add_argument("--repeats", type=int, default=None, metavar="R",
                       help="runs of every (problem, mode) (default 1)")
    suite.add_argument("--concurrency", type=int, default=None, metavar="N",
                       help="jobs at once on the cluster (default 1)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="output directory (default: specgen-runs/PROBLEM-MODE-TIME); it must "
                             "be empty or new, unless --force")
    parser.add_argument("--force", action="store_true",
                        help="write into a non-empty --out, replacing an earlier run's files")
    parser.add_argument("--resume", nargs="?", const="", default=None, metavar="DIR",
                        help="continue the killed run in DIR with its own settings (other options "
                             "but --quiet are not read): completed iterations stand, the one in "
                             "progress runs again from its start, and no candidate is evaluated "
                             "twice. A suite's folder: its unfinished jobs run (with problems "
                             "given, their settings must be the saved ones); no DIR: --out's")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.set_defaults(func=run_optimize)


# ---------------------------------------------------------------------------------- choices


# ---------------------------------------------------------------------------------- running


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
    """Build the job, connect to its scheduler (runtime/connect.py: --scheduler's, a local one, or
    one in this process), submit, follow."""
    from specgen.messages import OptimizeEvent
    from specgen.optimize.modes import Mechanisms
    from specgen.optimize.outputs import (
        JOURNAL_DIR, SCHEDULER_STATE, ResumedRun, RunWriter, check_out_dir, clear_run_files,
        write_run_settings,
    )
    from specgen.optimize.progress import ProgressDisplay
    from specgen.runtime.connect import cluster_settings, connect
    from specgen.runtime.settings import RuntimeSettings
    from specgen.runtime.transport import RuntimeFailure, SchedulerUnreachable

    from specgen.cli.suite import run_suite, wants_suite

    if args.resume == "":
        if not args.out:
            raise UsageError("--resume without a folder resumes --out's: give --out DIR or --resume DIR")
        args.resume = args.out
    if wants_suite(args):
        return run_suite(args)
    # One problem: the single run, as before the suites.
    args.problem = args.problem[0] if args.problem else None
    resumed_spec = None
    if args.resume:
        found = _resumed_args(args)
        if found is None:
            return 0
        args, resumed_spec = found
    # Everything the command line can get wrong is checked before anything is said or started.
    plan = plan_run(args)
    devices = devices_of(args)
    from specgen.cli import optimize_virtual

    if optimize_virtual.wants_virtual(args):
        say = (lambda text: None) if args.quiet else (lambda text: print(text, file=sys.stderr))
        return optimize_virtual.run(args, plan, devices, eval_options_of(args), say)
    if plan.llm == "vllm" and not args.devices and len(devices) > 1 and devices[0] == "cuda:0":
        # vLLM runs on cuda:0: it evaluates only when asked for (--devices), so that profiling
        # timings never share a GPU with the reasoning
        devices = devices[1:]
    eval_options = eval_options_of(args)
    overrides = list(args.runtime_settings or [])
    if overrides:
        RuntimeSettings().with_overrides(overrides)
    if args.out and not args.resume:
        check_out_dir(Path(args.out), args.force)   # before an engine loads a model
    kind = "remote" if args.scheduler else ("inprocess" if args.evaluation == "inprocess" else "local")
    if kind == "remote":
        check_remote_flags(args, eval_options)
    # With --scheduler the job's reasoner places the pool (--kv-pool goes with the job's options).
    kv_plan = kv_pool_plan(plan, args, devices)
    # The loop runs as the job's reasoner, which makes its own engine; a replayed trace is opened
    # here too, to check it and count its iterations.
    engine = make_engine(plan, args) if plan.llm == "replay" else None
    config = job_config(plan, args, engine, resumed_spec)
    spec = config.optimize

    out_dir = Path(args.out) if args.out else Path("specgen-runs") / spec.job_id
    if not args.resume:
        check_out_dir(out_dir, args.force)
        if args.force:
            clear_run_files(out_dir)   # one folder, one run: nothing of the earlier one stays
        write_run_settings(out_dir, _saved_options(args), spec)
    state_dir = out_dir / JOURNAL_DIR / SCHEDULER_STATE
    # The job replays its whole event stream to its follower: the file starts afresh.
    writer = RunWriter(out_dir, append=False)
    display = None if args.quiet else ProgressDisplay(sys.stderr)
    say = (lambda text: None) if args.quiet else (lambda text: print(text, file=sys.stderr))
    if plan.notice:
        say(plan.notice)
    if args.resume:
        # The job's reasoner journals the loop in the job's folder of the run's scheduler state.
        resume = ResumedRun.read(state_dir / "jobs" / spec.job_id)
        say(f"Resuming {spec.job_id} in {out_dir}: {len(resume.iterations)} iteration(s) done, "
            f"{len(resume.candidates)} candidate(s) and {len(resume.updates)} verdict(s) "
            f"journaled; iteration {len(resume.iterations) + 1} runs again from its start, "
            f"and the wall-time budget starts again.")
    if kind != "remote":
        on_cpu = all(d == "cpu" for d in devices)
        say(f"Evaluating on {len(devices)} worker(s): {', '.join(devices)}"
            + (" (CPU: C++ kernels run natively, Triton under its interpreter; timings are CPU "
               "timings)" if on_cpu else ""))

    def emit(event: OptimizeEvent) -> None:
        writer(event)
        if display is not None:
            display(event)

    async def follow() -> OptimizeResult:
        settings = (RuntimeSettings().with_overrides(overrides) if kind == "remote" else
                    cluster_settings(Mechanisms.of(spec).elastic_pools, eval_options, overrides))
        async with connect(kind, address=args.scheduler, keys=args.keys, devices=devices,
                           settings=settings, state_dir=state_dir,
                           kv_control=kv_plan.on and kind == "local") as cluster:
            live = None
            if kv_plan.on and display is not None and cluster.kv_control_endpoint:
                from specgen.optimize.kv_pool import LiveKvStats

                live = display.kv_pool = LiveKvStats(cluster, None)
            try:
                return await asyncio.to_thread(_follow, cluster.client, config, emit, say,
                                               existing=bool(args.resume),
                                               where=cluster.where if kind == "remote" else "")
            except SchedulerUnreachable as exc:
                if kind != "remote":
                    raise _resumable(cluster, exc, out_dir) from None
                # Raised by the wait on the job's events or result: the scheduler had taken the job.
                raise SchedulerUnreachable(f"{exc}; job {spec.job_id} stays in that scheduler's journal "
                                           f"and goes on when it is back") from None
            except RuntimeFailure as exc:
                if kind == "remote":
                    raise
                raise _resumable(cluster, exc, out_dir) from None
            finally:
                if live is not None:
                    display.kv_pool = None
                    live.close()

    try:
        result = asyncio.run(follow())
    finally:
        writer.close()
        if display is not None:
            display.close()
    written = writer.finish(result)
    _summary(result, written, say if not args.quiet else (lambda text: print(text)))
    _closing_screen(result, written, plan, args, devices, eval_options, say,
                    sys.stdout if args.quiet else sys.stderr)
    return 0 if result.status != "failed" else 1


def _resumable(cluster: Any, exc: Exception, out_dir: Path) -> Exception:
    """The failure of a cluster this command started: the job is journaled in the run's folder,
    so say what stopped it, and how to go on."""
    from specgen.runtime.transport import RuntimeFailure

    return RuntimeFailure(f"{cluster.failure or exc}; continue the run with: specgen "
                          f"optimize --resume {shlex.quote(str(out_dir))}")


def _follow(client: Any, config: JobConfig, emit: Callable[[Any], None], say: Callable[[str], None], *,
            existing: bool = False, where: str = "") -> OptimizeResult:
    """Submit the job to `client`'s scheduler (or, `existing`, follow the one it already runs: a
    resumed run) and turn its events and result into the loop's, for the run's outputs."""
    from specgen.optimize.job import NOTICE_EVENT, SCHEDULER_EVENTS, optimize_event, optimize_result

    spec = config.optimize
    if existing:
        job = client.job(spec.job_id)
    else:
        job = client.submit(config.to_job())
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


def _closing_screen(result: OptimizeResult, written: dict[str, Path], plan: Plan,
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
