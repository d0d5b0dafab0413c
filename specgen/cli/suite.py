"""`specgen optimize PROBLEMS... [--modes a,b] [--repeats R] [--concurrency N]`: a suite.

Every (problem, mode, repeat) is one optimize job, built by the same code as a single `optimize`
(cli/optimize_job.py: `plan_run`, `job_config`) and submitted the same way: through
`runtime.connect.connect()` to a local cluster this command starts (`--evaluation inprocess`: one in
this process; `--scheduler ADDR`: a running `specgen serve`). `--concurrency` jobs run at once on
that one cluster. A local cluster has one pool policy, and the modes differ in theirs (specgen's
pools are elastic, the baselines' static: optimize/modes.py), so a suite of both starts one local
cluster per policy over the same devices, as `specgen bench --clock wall` does.

What it keeps, in the results folder (`--out`; optimize/suite.py for the plan and the journal,
cli/suite_report.py for the report): `suite.json` (the plan), `journal.jsonl` (a line per finished
job), `jobs/PROBLEM/MODE-rK/` (each job's run files, as a single `optimize` writes them),
`traces/MODE/PROBLEM[.K].trace.json` (a live engine's turns, with the problem beside them), and at
the end `results.json`, `report.md`, `kernels/` and the plots. `--resume` runs only the jobs the
journal has no line for; jobs that were running when the suite died run again from their start.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from specgen.errors import UsageError

# Options that say how a suite runs, not what its jobs are: they may change on --resume.
VOLATILE = ("func", "problem", "out", "force", "resume", "quiet", "concurrency", "scheduler",
            "keys", "runtime_settings", "modes", "mode", "repeats")
# Replays are recorded too when set (tests: the recording path on a CPU without a live engine).
RECORD_REPLAYS = False


def wants_suite(args: argparse.Namespace) -> bool:
    from specgen.optimize.suite import PLAN_FILE, is_suite_request

    if args.resume and not args.problem:
        return (Path(args.resume or args.out or ".") / PLAN_FILE).is_file()
    return (is_suite_request(list(args.problem or [])) or args.modes is not None
            or args.repeats is not None or args.concurrency is not None)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}


def _modes(args: argparse.Namespace) -> list[str]:
    from specgen.optimize.modes import MODES

    modes = [m.strip() for m in (args.modes or args.mode).split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise UsageError(f"--modes: unknown mode(s) {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(MODES)}")
    if len(set(modes)) != len(modes):
        raise UsageError(f"--modes names a mode twice: {args.modes}")
    return modes


def _resumed(args: argparse.Namespace) -> argparse.Namespace:
    """`--resume DIR` with no problems: the suite's own command line, saved in its plan."""
    from specgen.optimize.suite import SuitePlan

    out = Path(args.resume or args.out)
    saved = SuitePlan.load(out)
    resumed = argparse.Namespace(**saved.options)
    resumed.keys = Path(resumed.keys) if resumed.keys else None
    resumed.out, resumed.resume, resumed.force, resumed.quiet = str(out), str(out), False, args.quiet
    if args.concurrency is not None:
        resumed.concurrency = args.concurrency
    resumed.func = args.func
    return resumed


def _trace_for(name: str, args: argparse.Namespace) -> Path | None:
    from specgen.traces.bundled import TRACE_SUFFIX, bundled_trace, generated_trace_path

    if args.trace:
        found = Path(args.trace) / f"{name}{TRACE_SUFFIX}"
        return found if found.is_file() else None
    found = bundled_trace(name) or generated_trace_path(name)
    return found if found.is_file() else None


class _Job:
    def __init__(self, key: Any, config: Any, record: dict[str, str] | None, elastic: bool,
                 repeats: int) -> None:
        self.key, self.config, self.record, self.elastic = key, config, record, elastic
        self.repeats = repeats


def _plan_jobs(args: argparse.Namespace, plan: Any, llm: str) -> list[_Job]:
    """Every job of the plan, built and checked before anything starts (a problem without a
    trace to replay, a bad flag: one error, nothing run)."""
    from specgen.cli.optimize_job import job_config, make_engine, plan_run
    from specgen.optimize.modes import Mechanisms

    jobs: list[_Job] = []
    traces: dict[str, Path] = {}
    if llm == "replay":
        missing = []
        for problem in plan.problems:
            trace = _trace_for(problem.name, args)
            if trace is None:
                missing.append(problem.name)
            else:
                traces[problem.name] = trace
        if missing:
            where = (f"no {missing[0]}.trace.json in {args.trace}" if args.trace else
                     "no bundled trace (specgen/traces/bundled.py)")
            raise UsageError(f"nothing to replay for problem(s) {', '.join(missing)}: {where}; run "
                             f"them on a live engine (--llm vllm|openai) or give --trace DIR "
                             f"holding PROBLEM.trace.json")
    engines: dict[str, Any] = {}
    model = args.model or llm
    for key in plan.keys():
        problem = next(p for p in plan.problems if p.name == key.problem)
        job_args = argparse.Namespace(**vars(args))
        job_args.problem, job_args.mode = str(problem.path), key.mode
        job_args.llm = llm
        job_args.trace = str(traces[key.problem]) if llm == "replay" else None
        job_plan = plan_run(job_args)
        if llm == "replay" and key.problem not in engines:
            engines[key.problem] = make_engine(job_plan, job_args)   # opens the trace: checked here
        config = job_config(job_plan, job_args, engines.get(key.problem))
        record = None
        if llm != "replay" or RECORD_REPLAYS:
            record = {"model": model, "notes": f"recorded live by a specgen optimize suite: mode "
                                               f"{key.mode}, repeat {key.repeat}"}
        jobs.append(_Job(key, config, record, Mechanisms.of(config.optimize).elastic_pools, plan.repeats))
    return jobs


def run_suite(args: argparse.Namespace) -> int:
    from specgen.cli.optimize_job import check_remote_flags, devices_of, eval_options_of
    from specgen.optimize.outputs import check_out_dir
    from specgen.optimize.suite import SuiteJournal, SuitePlan, discover

    if args.resume and not args.problem:
        args = _resumed(args)
    say = (lambda text: None) if args.quiet else (lambda text: print(text, file=sys.stderr))
    if args.clock == "virtual":
        raise UsageError("a suite runs on the wall clock (its jobs on the cluster); leave out --clock virtual")
    if args.llm == "vllm":
        raise UsageError("a suite runs many jobs at once, each with its own engine: --llm vllm would "
                         "load the model in every job's reasoner; serve it (`vllm serve`) and use "
                         "--llm openai --base-url URL")
    if args.trace and not Path(args.trace).is_dir():
        raise UsageError(f"--trace {args.trace}: a suite takes a folder of PROBLEM.trace.json files "
                         f"(a trace file is one problem's)")
    llm = args.llm or "replay"
    repeats = 1 if args.repeats is None else args.repeats
    concurrency = 1 if args.concurrency is None else args.concurrency
    if repeats < 1 or concurrency < 1:
        raise UsageError(f"--repeats and --concurrency must be at least 1, got {repeats} and {concurrency}")
    args.repeats, args.concurrency = repeats, concurrency
    found = discover(list(args.problem))
    for skipped in found.skipped:
        say(f"Skipped (not a KernelBench problem): {skipped}")
    options = _options(args)
    settings = {k: v for k, v in options.items() if k not in VOLATILE}
    plan = SuitePlan(found.problems, _modes(args), repeats, settings, options)
    out = Path(args.resume or args.out or Path("specgen-runs") / f"suite-{time.strftime('%Y%m%d-%H%M%S')}")
    if args.resume:
        saved = SuitePlan.load(out)
        changed = plan.differences(saved)
        if changed:
            raise UsageError(f"--resume {out}: this command's suite is not the one saved there "
                             f"({'; '.join(changed)}); run it with the saved settings "
                             f"(`specgen optimize --resume {shlex.quote(str(out))}` alone takes them) "
                             f"or into another --out")
    else:
        check_out_dir(out, args.force)
    devices = devices_of(args)
    eval_options = eval_options_of(args)
    kind = "remote" if args.scheduler else ("inprocess" if args.evaluation == "inprocess" else "local")
    if kind == "remote":
        check_remote_flags(args, eval_options)
    jobs = _plan_jobs(args, plan, llm)
    if not args.resume:
        if args.force:
            for name in ("suite.json", "journal.jsonl", "results.json", "report.md"):
                (out / name).unlink(missing_ok=True)
            for folder in ("jobs", "traces", "kernels", "plots", "cluster"):
                shutil.rmtree(out / folder, ignore_errors=True)
        plan.save(out)
    done = SuiteJournal.read(out)
    todo = [job for job in jobs if job.key.text not in done]
    say(f"Suite of {len(plan.problems)} problem(s) x {len(plan.modes)} mode(s) x {repeats} "
        f"repeat(s) = {len(jobs)} job(s) in {out}"
        + (f"; {len(jobs) - len(todo)} finished before, {len(todo)} to run" if args.resume else "")
        + (f"; engine: {llm}" + (" (bundled traces)" if llm == "replay" and not args.trace else "")))
    if kind != "remote":
        say(f"Evaluating on {len(devices)} worker(s): {', '.join(devices)}"
            + (" (CPU timings)" if all(d == "cpu" for d in devices) else ""))
    if todo:
        _run_jobs(todo, args, out, kind, devices, eval_options, len(jobs), len(jobs) - len(todo))
    from specgen.cli.suite_report import write_report

    rows = SuiteJournal.read(out)
    text = write_report(out, plan, [rows[j.key.text] for j in jobs if j.key.text in rows])
    print(text)
    return 0


def _run_jobs(todo: list[_Job], args: argparse.Namespace, out: Path, kind: str, devices: list[str],
              eval_options: dict[str, Any], total: int, finished: int) -> None:
    from specgen.cli.suite_progress import SuiteProgress
    from specgen.optimize.suite import SuiteJournal
    from specgen.optimize.suite_job import ENTRY
    from specgen.runtime.connect import cluster_settings, connect
    from specgen.runtime.settings import RuntimeSettings
    from specgen.runtime.transport import RuntimeFailure, SchedulerUnreachable

    overrides = list(args.runtime_settings or [])
    # Jobs that were running when an earlier attempt died run again from their start: their
    # cluster's journal would have its reasoners resume them beside the new ones.
    shutil.rmtree(out / "cluster", ignore_errors=True)
    policies = sorted({job.elastic for job in todo}, reverse=True) if kind != "remote" else [True]
    progress = SuiteProgress(total, finished, quiet=args.quiet)
    journal = SuiteJournal(out)
    resume_hint = f"continue the suite with: specgen optimize --resume {shlex.quote(str(out))}"

    async def run_all() -> None:
        async with contextlib.AsyncExitStack() as stack:
            clusters: dict[bool, Any] = {}
            for elastic in policies:
                if kind == "remote":
                    settings = RuntimeSettings().with_overrides(overrides)
                else:
                    settings = cluster_settings(elastic, eval_options, overrides)
                    settings.job_entries = [*settings.job_entries, ENTRY]
                state = out / "cluster" / ("elastic" if elastic else "static")
                clusters[elastic] = await stack.enter_async_context(connect(
                    kind, address=args.scheduler, keys=args.keys, devices=devices,
                    settings=settings, state_dir=state if kind != "remote" else None))
            gate = asyncio.Semaphore(args.concurrency)

            async def one(job: _Job) -> None:
                async with gate:
                    cluster = clusters[job.elastic if kind != "remote" else True]
                    progress.started(job.key)
                    try:
                        row = await asyncio.to_thread(_run_one, cluster.client, job, out, progress)
                    except (SchedulerUnreachable, RuntimeFailure) as exc:
                        raise RuntimeFailure(f"{getattr(cluster, 'failure', None) or exc}; "
                                             f"{resume_hint}") from None
                    if row is not None:
                        journal.add(row)
                    progress.finished(job.key, row)

            tasks = [asyncio.ensure_future(one(job)) for job in todo]
            try:
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    try:
        asyncio.run(run_all())
    finally:
        journal.close()
        progress.close()
    # Every job ran to its end: the clusters' journals hold nothing to continue.
    shutil.rmtree(out / "cluster", ignore_errors=True)


def _run_one(client: Any, job: _Job, out: Path, progress: Any) -> dict[str, Any] | None:
    """Submit one job, follow it into its folder; its journal row (None: it did not finish)."""
    from specgen.optimize.job import NOTICE_EVENT, SCHEDULER_EVENTS, optimize_event, optimize_result
    from specgen.optimize.outputs import RunWriter, clear_run_files
    from specgen.optimize.suite import job_row
    from specgen.optimize.suite_job import ENTRY, RECORD_OPTION, TRACE_KEY

    spec = job.config.to_job()
    if job.record is not None:
        spec.options[RECORD_OPTION] = job.record
        spec.entry = ENTRY
    folder = job.key.folder(out)
    clear_run_files(folder)
    writer = RunWriter(folder)
    try:
        try:
            handle = client.submit(spec)
        except Exception as exc:
            if "job_entries" in str(exc):
                raise UsageError(f"{exc}: a suite on a live engine records each turn through "
                                 f"{ENTRY}, which that scheduler must list in its setting "
                                 f"job_entries") from None
            raise
        try:
            for event in handle.events():
                if event.kind == NOTICE_EVENT or event.kind in SCHEDULER_EVENTS:
                    continue
                loop_event = optimize_event(event)
                writer(loop_event)
                progress.event(job.key, loop_event)
            raw = handle.result()
        except KeyboardInterrupt:
            handle.cancel()
            raise
    finally:
        writer.close()
    result = optimize_result(raw)
    writer.finish(result)
    if result.status == "cancelled":
        return None
    trace_path = None
    if isinstance(raw.summary, dict) and raw.summary.get(TRACE_KEY):
        trace_path = _save_trace(raw.summary[TRACE_KEY], job, out)
    return job_row(job.key, result, folder, out, trace_path)


def _save_trace(data: dict[str, Any], job: _Job, out: Path) -> Path:
    """The job's turns as `traces/MODE/PROBLEM[.K].trace.json`, the problem beside it (where
    `specgen bench` looks for a trace's problem)."""
    from specgen.runtime.private_files import make_private_dir, write_private
    from specgen.traces.format import Trace

    folder = make_private_dir(out / "traces" / job.key.mode)
    spec = job.config.optimize
    sample = f".{job.key.repeat}" if job.repeats > 1 else ""
    path = folder / f"{spec.problem_name}{sample}.trace.json"
    Trace.from_json(data, source=str(path)).save(path)
    beside = folder / f"{spec.problem_name}.py"
    if not beside.is_file():
        write_private(beside, spec.problem_source)
    return path
