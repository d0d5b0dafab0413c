"""The main job's remote KV pool: vLLM's offloading connector with specgen's spec, configured on
the job's vLLM engine once the cluster is up (the pool registers on the scheduler's KV control
channel, so the scheduler shrinks it when a profiling run on its GPU needs the memory).

Where the pool lives is `kv/engine_config.py`'s decision (`--kv-pool`); this module only attaches
it, after checking that the installed vLLM is one the spec can drive.
"""
from __future__ import annotations

import socket
import time
import uuid

from specgen.kv.engine_config import DEFAULT_POOL_GIB, KvPoolPlan, plan_kv_pool


def supported(version: str | None = None) -> tuple[bool, str]:
    """Whether the installed vLLM is one the spec implements, and the version."""
    try:
        import vllm
    except ImportError:
        return False, "not installed"
    from specgen.kv.vllm_offload import SUPPORTED_VLLM_VERSIONS

    version = version or str(vllm.__version__).split("+")[0]
    return version in SUPPORTED_VLLM_VERSIONS, version


def attach(engine: object, plan: KvPoolPlan, control_endpoint: str | None) -> tuple[str, str]:
    """Configure `engine` (a VLLMEngine not yet started) to keep KV blocks in the pool `plan`
    describes. Returns a line for the run's notice (which says so when the pool is not used) and
    the pool's identity on the scheduler's KV control channel ("" when there is no pool)."""
    if not plan.on:
        return f"KV pool: off ({plan.reason}).", ""
    ok, version = supported()
    if not ok:
        from specgen.kv.vllm_offload import SUPPORTED_VLLM_VERSIONS

        return (f"KV pool: not used: vLLM {version} is not a release specgen's offloading spec "
                f"drives (supported: {', '.join(SUPPORTED_VLLM_VERSIONS)}); running without it.", "")
    from vllm.config import KVTransferConfig

    engine_id = f"specgen-{uuid.uuid4().hex[:8]}"
    engine.configure(kv_transfer_config=KVTransferConfig(   # type: ignore[attr-defined]
        kv_connector="OffloadingConnector", kv_role="kv_both", engine_id=engine_id,
        kv_connector_extra_config=plan.extra_config(control_endpoint)))
    where = "registered with the scheduler" if control_endpoint else "not registered (in-process evaluation)"
    return (f"KV pool: {plan.pool_bytes / (1 << 30):g} GiB in {plan.reason} ({engine_id}, {where}).",
            engine_id if control_endpoint else "")


def attach_in_cluster(engine: object, backend: object, choice: str = "auto",
                      pool_gib: float = DEFAULT_POOL_GIB) -> tuple[str, str]:
    """`attach` for a job's engine in its reasoner (a scheduler job): the pool goes where `choice`
    says given the evaluation GPUs the cluster has on this machine (from the scheduler's view of its
    workers), and registers on the scheduler's KV control channel when it has one open."""
    stats = backend.client.stats()   # type: ignore[attr-defined]
    host = socket.gethostname()
    devices = [w.device for w in stats.workers if w.host == host]
    return attach(engine, plan_kv_pool(choice, devices, pool_gib=pool_gib), stats.kv_control_endpoint or None)


def final_stats(backend: object, pool_id: str | None, *, settle_s: float = 0.0, timeout_s: float = 3.0):
    """The pool's latest KvPoolStats as the scheduler holds them (None if it never reported).

    `backend` is anything with the scheduler's `client`; `pool_id` None means the one pool the
    scheduler knows (an embedded cluster's job: its reasoner named the pool). With `settle_s`, wait
    (at most `timeout_s`) until they have not changed for that long: at a job's end the pool's last
    report may still be on its way to the scheduler."""
    client = getattr(backend, "client", None)
    if pool_id == "" or client is None:
        return None

    def read():
        views = client.stats().kv_pools
        if pool_id is None:
            return views[0].stats if len(views) == 1 else None
        for view in views:
            if view.pool == pool_id:
                return view.stats
        return None

    latest = read()
    if settle_s <= 0:
        return latest
    deadline, steady_since = time.monotonic() + timeout_s, time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - steady_since < settle_s:
        time.sleep(0.05)
        now = read()
        if now != latest:
            latest, steady_since = now, time.monotonic()
    return latest


class LiveKvStats:
    """The pool's latest KvPoolStats for the progress display, without blocking it: a daemon thread
    asks the scheduler every `interval_s` (the display redraws ten times a second; the scheduler's
    figures change about once a second, as often as the pool reports)."""

    def __init__(self, backend: object, pool_id: str | None, interval_s: float = 1.0) -> None:
        import threading

        self._backend, self._pool_id, self._interval_s = backend, pool_id, interval_s
        self._latest = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-pool-stats", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                stats = final_stats(self._backend, self._pool_id)
            except Exception:   # a figure missed now is shown at the next poll; the job goes on
                stats = None
            if stats is not None:
                self._latest = stats
            self._stop.wait(self._interval_s)

    def __call__(self):
        return self._latest

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
