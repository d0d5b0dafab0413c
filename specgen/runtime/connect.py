"""`connect`: the scheduler a run talks to, whichever kind serves it, behind one interface.

    async with connect("local", devices=["cuda:0", "cuda:1"], settings=settings) as cluster:
        job = await asyncio.to_thread(cluster.client.submit, spec)     # follow it, from a thread

- "remote": a running `specgen serve` at `address` (its nodes evaluate, its reasoners run jobs);
- "local": a scheduler and a node as processes of this machine (runtime/local.py), supervised;
- "inprocess": the same scheduler core, workers and reasoners in this process (runtime/inprocess.py):
  nothing started besides the evaluations' own runners, the job's loop on the running event loop.

Whatever the kind, the job is a scheduler job and the loop runs as its reasoner: one run path, one
enforcer of each budget (the loop its own, the scheduler core the job's wall time). What each kind
yields has `client` (a runtime Client), `backend()` (an EvaluationBackend over it), `failure` (what
stopped the cluster for good, or None), `kv_control_endpoint` (where a remote KV pool registers, or
None) and `where` (the scheduler, in words).
"""
from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, AsyncIterator

from specgen.errors import UsageError
from specgen.runtime.client import Client
from specgen.runtime.scheduler_backend import SchedulerEvaluationBackend
from specgen.runtime.settings import RuntimeSettings

KINDS = ("remote", "local", "inprocess")


def cluster_settings(elastic: bool, eval_options: dict[str, Any],
                     overrides: list[str] | tuple[str, ...] = ()) -> RuntimeSettings:
    """The settings of a cluster a run starts for itself ("local", "inprocess"): its pools
    elastic or static, its workers' evaluation options (EvalOptions' fields), then `--set`'s
    NAME=VALUE overrides."""
    settings = RuntimeSettings(pool_mode="elastic" if elastic else "static", eval_options=eval_options)
    return settings.with_overrides(list(overrides))


class RemoteScheduler:
    """A `specgen serve` elsewhere, as `connect` yields it."""

    failure = None
    kv_control_endpoint = None

    def __init__(self, client: Client) -> None:
        self.client = client
        self.where = f"the scheduler at {client.address}"

    def backend(self) -> SchedulerEvaluationBackend:
        return SchedulerEvaluationBackend(self.client)


@contextlib.asynccontextmanager
async def connect(kind: str, *, address: str | None = None, keys: Path | str | None = None,
                  devices: list[str] | None = None, settings: RuntimeSettings | None = None,
                  state_dir: Path | None = None, kv_control: bool = False) -> AsyncIterator[Any]:
    """The scheduler of `kind` (see the module docstring), up for the block. `address` and `keys`
    are for "remote"; `devices`, `state_dir` (the journal and the jobs' folders: a run resumed over
    the same one continues) and `kv_control` (open the KV pools' control channel) for the others.
    `settings`: the runtime's (for "remote", this side's connection settings only)."""
    settings = settings or RuntimeSettings()
    if kind == "remote":
        if not address:
            raise UsageError("connect('remote') needs the scheduler's address")
        client = await asyncio.to_thread(Client, address, keys=keys, settings=settings)
        try:
            yield RemoteScheduler(client)
        finally:
            client.close()
        return
    if kind not in KINDS:
        raise UsageError(f"no scheduler kind {kind!r}: one of {', '.join(KINDS)}")
    if not devices:
        raise UsageError(f"connect({kind!r}) needs the devices to evaluate on")
    if kind == "local":
        from specgen.runtime.local import LocalCluster

        cluster = LocalCluster(devices=devices, settings=settings, kv_control=kv_control,
                               state_dir=state_dir, supervise=True)
        await asyncio.to_thread(cluster.start)
        try:
            yield cluster
        finally:
            await asyncio.to_thread(cluster.stop)
        return
    from specgen.runtime.inprocess import InProcessCluster

    async with InProcessCluster(devices, settings=settings, state_dir=state_dir) as inprocess:
        yield inprocess
