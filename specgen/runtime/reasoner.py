"""The reasoner actor process: hosts one job's optimize loop, started by the scheduler.

    python -m specgen.runtime.reasoner --scheduler ADDRESS --job-id ID [--run-dir DIR]

It registers as the job's reasoner, fetches the job's spec, and calls the spec's entry point
("module:function", sync or async):

    entry(spec: JobSpec, backend: EvaluationBackend, emit: Callable[[JobEvent], None]) -> JobResult | Any

`backend` is a SchedulerEvaluationBackend over this process's connection; `emit` relays progress
events to the scheduler (journaled, forwarded to the job's subscribers). A return value that is
not a JobResult becomes the `summary` of a "succeeded" JobResult; an exception becomes a "failed"
one naming it (its traceback goes to this process's log, on the scheduler's host). Before the entry
runs, names the setting `engine_sources` gives in `options["engine"]` become their values, and
what the reasoner reports (events, result) shows those values by their names again
(runtime/engine_sources.py): a client reads no path or URL of the host. An entry with a `run_dir`
parameter also gets the job's folder (`--run-dir`, under the scheduler's state directory), which
outlives the reasoner: the optimize loop journals its progress there, so a reasoner started again
after a crash or a scheduler restart continues at the iteration in progress. Candidates it submits again are
recognized (same job and candidate id) and answered from the scheduler's journal instead of being
evaluated twice. SIGTERM (job cancelled or timed out)
cancels the loop's task, so the loop can abort its generations on the way out.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import logging
import signal
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import msgspec

from specgen.messages import JobEvent, JobResult, JobSpec
from specgen.runtime.auth import client_keys_from_env, client_keys_from_text, present_credential
from specgen.runtime.child_process import die_with_parent, take_secrets
from specgen.runtime.client import Client
from specgen.runtime.engine_sources import Redactor, resolve
from specgen.runtime.plugins import load_plugins
from specgen.runtime.scheduler_backend import SchedulerEvaluationBackend
from specgen.runtime.settings import settings_from_env

log = logging.getLogger("specgen.reasoner")


def resolve_entry(entry: str) -> Callable[..., Any]:
    module_name, _, attr = entry.partition(":")
    if not module_name or not attr:
        raise ValueError(f"job entry {entry!r} must be 'module:function'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"job entry {entry!r} is not callable")
    return obj


def as_job_result(job_id: str, value: Any) -> JobResult:
    if isinstance(value, JobResult):
        value.job_id = value.job_id or job_id
        return value
    summary = msgspec.to_builtins(value) if value is not None else {}
    if not isinstance(summary, dict):
        summary = {"value": summary}
    return JobResult(job_id=job_id, status="succeeded", summary=summary)


async def run_entry(spec: JobSpec, client: Client, run_dir: Path | None = None,
                    redact: Redactor = Redactor({})) -> JobResult:
    backend = SchedulerEvaluationBackend(client)

    def emit(event: JobEvent) -> None:
        event.job_id = spec.job_id
        event.data = redact(event.data)
        client.report_event(event)

    entry = resolve_entry(spec.entry)
    # An entry that takes `run_dir` gets the job's folder: there it journals what it must not
    # lose, and a reasoner started again after a crash finds it.
    extra = {"run_dir": run_dir} if run_dir is not None and "run_dir" in inspect.signature(entry).parameters else {}
    if inspect.iscoroutinefunction(entry):
        value = await entry(spec, backend, emit, **extra)
    else:
        value = await asyncio.to_thread(entry, spec, backend, emit, **extra)
    return as_job_result(spec.job_id, value)


async def serve_job(client: Client, job_id: str, run_dir: Path | None = None,
                    stopped: Callable[[], bool] = lambda: False) -> int:
    """Run job `job_id`'s entry as its reasoner and report how it ended. Cancelled with
    `stopped()` true (the scheduler stopped it: the job was cancelled or timed out, or the cluster
    is shutting down), it reports nothing: the scheduler has decided the job's end, or resumes it."""
    spec = await asyncio.to_thread(client.job_spec, job_id)
    redact = resolve(spec.options, client.settings.engine_sources)
    try:
        result = await run_entry(spec, client, run_dir, redact)
    except asyncio.CancelledError:
        if stopped():
            log.info("job %s: stopped by the scheduler", job_id)
            return 0
        result = JobResult(job_id=job_id, status="cancelled", error="the job's loop was cancelled")
    except Exception as exc:  # noqa: BLE001 - the job failed, the reasoner reports it
        # The traceback names files of this host: it stays in this process's log.
        log.error("job %s failed:\n%s", job_id, traceback.format_exc())
        result = JobResult(job_id=job_id, status="failed",
                           error=f"{type(exc).__name__}: {exc} (the traceback is in the job's "
                                 "reasoner log on the scheduler's host)")
    result.error = redact(result.error)
    result.summary = redact(result.summary)
    await asyncio.to_thread(client.report_result, result)
    return 0


async def _main_async(client: Client, job_id: str, run_dir: Path | None = None) -> int:
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(serve_job(client, job_id, run_dir, stopped=lambda: terminated))
    terminated = False

    def on_term() -> None:
        nonlocal terminated
        terminated = True
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, on_term)
    loop.add_signal_handler(signal.SIGINT, on_term)
    try:
        return await task
    except asyncio.CancelledError:
        # Cancelled before its entry started (still fetching the spec).
        log.info("job %s: stopped by the scheduler", job_id)
        return 0


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(prog="python -m specgen.runtime.reasoner")
    parser.add_argument("--scheduler", required=True)
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--run-dir", type=Path, default=None, help="the job's folder (kept across reasoner restarts)")
    args = parser.parse_args(argv)
    # The job's credential and CURVE keys come from the scheduler through the secrets pipe.
    secrets = take_secrets()
    keys = client_keys_from_text(secrets.get("curve")) or client_keys_from_env(pop=True)
    present_credential("reasoner", args.job_id, secrets.get("credential", ""))
    # After the secrets were taken (a plug-in's code never sees them), before the job's spec is
    # fetched: its engine and fork model may be a plug-in's.
    load_plugins()
    client = Client(args.scheduler, keys=keys, settings=settings_from_env(),
                    role="reasoner", name=args.job_id)
    try:
        return asyncio.run(_main_async(client, args.job_id, args.run_dir))
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
