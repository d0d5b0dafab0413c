"""Every knob of the actor runtime in one struct, so each timeout error can name its setting.

Settings travel to child processes as JSON in the `SPECGEN_RUNTIME_SETTINGS` environment variable
and can be overridden on any command line with `--set NAME=VALUE`.
"""
from __future__ import annotations

import os
from typing import get_args

import msgspec

from specgen.errors import UsageError
from specgen.messages import EvalOptions, PoolMode
from specgen.runtime.engine_sources import EngineSources, check_names

SETTINGS_ENV = "SPECGEN_RUNTIME_SETTINGS"


class RuntimeSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # liveness
    heartbeat_interval_s: float = 0.5       # every peer sends a heartbeat this often
    peer_timeout_s: float = 15.0            # a peer silent this long is declared lost (process
                                            # deaths are seen at once by their node; this is for
                                            # hung or cut-off peers, so it tolerates a loaded host)
    ready_timeout_s: float = 180.0          # a started worker/reasoner must report READY by then
    connect_timeout_s: float = 15.0         # a client waits this long for the scheduler's Welcome
    call_timeout_s: float = 120.0           # a client request fails once the scheduler said nothing of
                                            # it this long: no reply, and for an evaluation no notice
                                            # (EvaluateQueued: queue position, or running) either; these
                                            # come every call_timeout_s / 4 while it waits or runs and
                                            # each restarts the wait, so a long queue is not a timeout
    shutdown_grace_s: float = 5.0           # SIGTERM, then SIGKILL after this long
    scheduler_timeout_s: float = 60.0       # a client waiting on a job (its events, its result) gives up
                                            # once the scheduler said nothing for this long: it died or
                                            # cannot be reached (a restarted one is back well within it)
    # limits (a ROUTER silently drops messages past its high-water mark: bound what is in flight)
    max_message_bytes: int = 16 * 1024 * 1024  # larger messages are refused with an error reply
    max_queued_requests: int = 20_000       # submissions past this are refused ("busy")
    max_outstanding_submits: int = 512      # a backend waits for acks past this many
    socket_hwm: int = 100_000               # ZeroMQ high-water mark of every socket
    max_request_attempts: int = 3           # a request that lost this many workers fails
    # pools
    pool_mode: PoolMode = "elastic"         # elastic: workers move between pools with the load
    static_validate_workers: int | None = None  # static split: validators (None: half, rounded up)
    lend_idle_workers: bool = True          # elastic: an idle worker takes the other pool's work
    min_pool_workers: int = 1               # elastic: never shrink a pool below this (if >= 2 workers)
    rebalance_interval_s: float = 0.5       # elastic: at most one pool change this often
    rate_window_s: float = 10.0             # arrival rates are measured over this window
    drain_horizon_s: float = 5.0            # queued work counts as load to clear within this time
    hysteresis_workers: float = 0.35        # move a worker only when the target is off by 0.5 + this
    initial_service_s: float = 1.0          # service-time estimate before one is measured
    # priority: criteria for picking the next request, most significant first
    priority_rule: list[str] = msgspec.field(
        default_factory=lambda: ["deadline", "final_first", "stage", "oldest"])
    # jobs
    default_job_entry: str = "specgen.optimize.job:run_scheduled_job"   # the optimize loop
    # The only "module:function"s a job may run in its reasoner: any client can create jobs, and
    # an entry is code the scheduler's host runs (add your own entry here to run it).
    job_entries: list[str] = msgspec.field(default_factory=lambda: [
        "specgen.optimize.job:run_scheduled_job", "specgen.runtime.jobs:evaluate_candidates"])
    # The only models, tokenizers, base URLs and traces a plain client's job may name for its
    # engine, by name: the job's reasoner opens them on this host (runtime/engine_sources.py).
    # The admin (the operator's own `specgen optimize`) is not held to it.
    engine_sources: EngineSources = msgspec.field(default_factory=EngineSources)
    job_grace_s: float = 30.0               # past a job's wall time, its reasoner gets this long
    reasoner_max_restarts: int = 3          # a job's reasoner that dies is started again this often
    # workers and nodes
    worker_restart_backoff_s: float = 1.0   # wait before restarting a worker that died
    worker_max_restarts: int = 10           # restarts of one worker within 10 minutes, then give up
    spare_processes: int = 1                # evaluation: candidate processes kept started ahead
    cluster_max_restarts: int = 3           # a supervised LocalCluster (`specgen optimize`'s) restarts its
                                            # scheduler, or one node, at most this often in 10 minutes;
                                            # the next death ends the cluster (0: never restart)
    eval_options: EvalOptions = msgspec.field(default_factory=EvalOptions)  # every worker's evaluation
    # remote KV pools (runtime/kv_steward.py): the scheduler sees their size and hit rate and makes
    # room for evaluations on the GPU they live on
    kv_control_bind: str | None = None      # bind the pools' control channel here (None = off); loopback
                                            # only: the channel has no CURVE, and pools live on the
                                            # scheduler's host or reach it through a tunnel
    kv_reserve_bytes: int = 8 << 30         # a pool gives back this much per GPU of its own that runs an
                                            # evaluation (a candidate's tensors, workspace, CUDA context)
    kv_regrow_idle_s: float = 1.0           # grow a pool back once its GPUs stayed idle this long (a
                                            # worker that takes its next request at once keeps the room)
    kv_pool_timeout_s: float = 30.0         # forget a pool silent this long (a vLLM engine's pool reports
                                            # only while the engine steps, so this is longer than
                                            # peer_timeout_s)

    def __post_init__(self) -> None:
        # Given as EvalOptions' fields (a dict, as callers write them): typed here, once, so every
        # process receives them typed and an unknown field is refused where it was written.
        if not isinstance(self.eval_options, EvalOptions):
            try:
                self.eval_options = msgspec.convert(self.eval_options, EvalOptions)
            except msgspec.ValidationError as exc:
                raise UsageError(f"setting eval_options: {exc} (the fields are EvalOptions', "
                                 "specgen/messages/runners.py)") from None
        if not isinstance(self.engine_sources, EngineSources):
            try:
                self.engine_sources = msgspec.convert(self.engine_sources, EngineSources)
            except msgspec.ValidationError as exc:
                raise UsageError(f"setting engine_sources: {exc} (the fields are models, tokenizers, "
                                 "base_urls and traces, each {name: value})") from None

    def check(self) -> "RuntimeSettings":
        # Decoded settings are checked by their type; settings built in code are checked here.
        if self.pool_mode not in get_args(PoolMode):
            raise UsageError(f"pool_mode must be 'elastic' or 'static', not {self.pool_mode!r}")
        from specgen.runtime.priority import PRIORITY_CRITERIA

        unknown = [c for c in self.priority_rule if c not in PRIORITY_CRITERIA]
        if unknown:
            raise UsageError(
                f"priority_rule has unknown criteria {unknown}; known: {sorted(PRIORITY_CRITERIA)}"
            )
        for name in ("heartbeat_interval_s", "peer_timeout_s", "ready_timeout_s",
                     "connect_timeout_s", "call_timeout_s", "scheduler_timeout_s",
                     "rebalance_interval_s"):
            if getattr(self, name) <= 0:
                raise UsageError(f"setting {name} must be positive")
        if self.peer_timeout_s <= self.heartbeat_interval_s:
            raise UsageError("setting peer_timeout_s must exceed heartbeat_interval_s")
        if self.cluster_max_restarts < 0:
            raise UsageError("setting cluster_max_restarts must not be negative")
        if self.kv_reserve_bytes < 0 or self.kv_regrow_idle_s < 0:
            raise UsageError("settings kv_reserve_bytes and kv_regrow_idle_s must not be negative")
        if self.kv_pool_timeout_s <= 0:
            raise UsageError("setting kv_pool_timeout_s must be positive")
        wrong = check_names(self.engine_sources)
        if wrong:
            raise UsageError(wrong)
        if self.kv_control_bind is not None:
            from specgen.runtime.auth import is_loopback

            if not is_loopback(self.kv_control_bind):
                raise UsageError(
                    f"setting kv_control_bind={self.kv_control_bind!r} is not a loopback address: the KV "
                    "pools' control channel has no authentication; bind ipc://, tcp://127.0.0.1 or "
                    "tcp://[::1] (pools on other hosts reach it through an SSH tunnel)")
        return self

    def to_env(self) -> str:
        return msgspec.json.encode(self).decode()

    def with_overrides(self, pairs: list[str]) -> "RuntimeSettings":
        """Apply `NAME=VALUE` pairs (VALUE parsed as JSON, else taken as a string)."""
        data = msgspec.to_builtins(self)
        for pair in pairs:
            name, sep, raw = pair.partition("=")
            if not sep or name not in data:
                raise UsageError(
                    f"--set expects NAME=VALUE with NAME one of {sorted(data)}; got {pair!r}"
                )
            try:
                data[name] = msgspec.json.decode(raw)
            except msgspec.DecodeError:
                data[name] = raw
        try:
            return msgspec.convert(data, RuntimeSettings).check()
        except msgspec.ValidationError as exc:
            where = " (the fields are EvalOptions', specgen/messages/runners.py)" \
                if "$.eval_options" in str(exc) else ""
            raise UsageError(f"bad --set value: {exc}{where}") from None


def settings_from_env() -> RuntimeSettings:
    raw = os.environ.get(SETTINGS_ENV)
    if not raw:
        return RuntimeSettings()
    return msgspec.json.decode(raw, type=RuntimeSettings).check()
