"""The scheduler's side of the remote KV pools: what they report, and room for evaluations.

A remote KV pool (specgen/kv/pool.py, or vLLM's offloading connector through specgen/kv/vllm_offload.py)
keeps prefix KV blocks in spare memory of GPUs that also run evaluation workers. Each pool reports its
`KvPoolStats` on the control channel the scheduler binds (setting `kv_control_bind`); this class, plain
logic without sockets, keeps the latest report per pool and decides when a pool should change size:

- A pool is paired with the workers on the same host and device (`KvPoolStats.host`/`devices` against
  the worker's host and device; a pool in host memory, device -1, pairs with the host's CPU workers).
- When the scheduler has given evaluation work to a paired worker, the pool is asked to shrink by
  `kv_reserve_bytes` per busy paired device, from the size it had before the busy period (remembered
  per pool; the target never goes below 0).
- When the paired devices have stayed idle for `kv_regrow_idle_s`, the pool is asked to grow back to
  the remembered size.

One shrink per busy period, one grow-back per idle period: `steer` compares the busy count with the one
the last request was based on, so repeated passes send nothing new, and a worker that finishes and takes
its next request within `kv_regrow_idle_s` keeps the room it has. Copies in flight are the pool's
concern (it waits for them before giving memory back). A pool silent for `kv_pool_timeout_s` is
forgotten; if it comes back it starts afresh.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterable

from specgen.messages import KvPoolResize, KvPoolStats, KvPoolView

log = logging.getLogger(__name__)

HOST_MEMORY = -1   # the device number of host memory in KvPoolStats.devices


def device_index(device: str) -> int | None:
    """A worker's device as pools number theirs: "cpu" -> -1, "cuda:N" -> N, anything else -> None."""
    if device == "cpu":
        return HOST_MEMORY
    kind, _, index = device.partition(":")
    if kind == "cuda" and index.isdigit():
        return int(index)
    return None


@dataclass(frozen=True)
class WorkerPlacement:
    """What the steward needs to know of a worker."""

    name: str
    host: str
    device: int | None          # see device_index
    busy: bool                  # an evaluation is assigned to it


@dataclass
class PoolRecord:
    identity: bytes             # the pool's routing identity on the control channel
    stats: KvPoolStats
    last_report: float
    busy_devices: int = 0       # busy paired devices the last request was based on
    restore_bytes: int | None = None    # size before this busy period (None: not shrunk by us)
    target_bytes: int | None = None     # size last asked for
    lower_since: float | None = None    # since when fewer devices are busy than busy_devices says
    resend: bool = False        # the last request could not be delivered: send it again when it reports
    shrinks_requested: int = 0
    grows_requested: int = 0
    paired_workers: list[str] = field(default_factory=list)


class KvPoolSteward:
    def __init__(self, reserve_bytes: int, regrow_idle_s: float, pool_timeout_s: float) -> None:
        if reserve_bytes < 0:
            raise ValueError("reserve_bytes must not be negative")
        self.reserve_bytes = reserve_bytes
        self.regrow_idle_s = regrow_idle_s
        self.pool_timeout_s = pool_timeout_s
        self.pools: dict[bytes, PoolRecord] = {}
        self._requests = 0
        self._resends: list[tuple[bytes, KvPoolResize]] = []

    # -- what pools tell us ----------------------------------------------------------------
    def on_stats(self, identity: bytes, stats: KvPoolStats, now: float) -> None:
        rec = self.pools.get(identity)
        if rec is None:
            rec = self.pools[identity] = PoolRecord(identity=identity, stats=stats, last_report=now)
            log.info("KV pool %s reporting: %d bytes on %s %s", identity.decode(errors="replace"),
                     stats.capacity_bytes, stats.host or "?", stats.devices)
        rec.stats = stats
        rec.last_report = now
        if rec.resend and rec.target_bytes is not None:
            # It is connected again: what it missed still holds.
            rec.resend = False
            self._resends.append((identity, self._request(rec.target_bytes, "resend")))

    def send_failed(self, identity: bytes) -> None:
        """The control socket could not deliver a request to this pool (it disconnected)."""
        rec = self.pools.get(identity)
        if rec is not None:
            rec.resend = True

    def expire(self, now: float) -> list[bytes]:
        """Forget pools silent for more than pool_timeout_s; their identities."""
        gone = [i for i, rec in self.pools.items() if now - rec.last_report > self.pool_timeout_s]
        for identity in gone:
            del self.pools[identity]
            log.info("KV pool %s forgotten: silent for more than %g s (setting kv_pool_timeout_s)",
                     identity.decode(errors="replace"), self.pool_timeout_s)
        return gone

    # -- decisions --------------------------------------------------------------------------
    def steer(self, workers: Iterable[WorkerPlacement], now: float) -> list[tuple[bytes, KvPoolResize]]:
        """Resize requests (pool identity, request) that the workers' state calls for now."""
        out, self._resends = self._resends, []
        workers = list(workers)
        for rec in self.pools.values():
            stats = rec.stats
            paired = [w for w in workers if w.device is not None and w.host == stats.host
                      and w.device in stats.devices]
            rec.paired_workers = sorted(w.name for w in paired)
            busy = len({w.device for w in paired if w.busy})
            if self.reserve_bytes == 0:
                rec.busy_devices = busy
                continue
            if busy > rec.busy_devices:
                self._more_busy(rec, busy, out)
            elif busy < rec.busy_devices:
                if rec.lower_since is None:
                    rec.lower_since = now
                if now - rec.lower_since >= self.regrow_idle_s:
                    self._fewer_busy(rec, busy, out)
            else:
                rec.lower_since = None   # back to where the last request left it: nothing to undo
        return out

    def _more_busy(self, rec: PoolRecord, busy: int, out: list[tuple[bytes, KvPoolResize]]) -> None:
        shrunk = rec.restore_bytes is not None
        base = rec.restore_bytes if shrunk else rec.stats.capacity_bytes
        current = rec.target_bytes if shrunk and rec.target_bytes is not None else rec.stats.capacity_bytes
        target = max(0, base - self.reserve_bytes * busy)
        rec.busy_devices = busy
        rec.lower_since = None
        if target < current:
            rec.restore_bytes = base
            rec.target_bytes = target
            rec.shrinks_requested += 1
            out.append((rec.identity, self._request(target, "shrink")))

    def _fewer_busy(self, rec: PoolRecord, busy: int, out: list[tuple[bytes, KvPoolResize]]) -> None:
        rec.busy_devices = busy
        rec.lower_since = None
        if rec.restore_bytes is None:
            return
        target = rec.restore_bytes if busy == 0 else max(0, rec.restore_bytes - self.reserve_bytes * busy)
        if busy == 0:
            rec.restore_bytes = None
        if rec.target_bytes is None or target > rec.target_bytes:
            rec.target_bytes = target
            rec.grows_requested += 1
            out.append((rec.identity, self._request(target, "grow")))

    def _request(self, target: int, kind: str) -> KvPoolResize:
        self._requests += 1
        return KvPoolResize(target_bytes=target, request_id=f"scheduler-{kind}-{self._requests}")

    # -- reporting --------------------------------------------------------------------------
    def views(self, now: float) -> list[KvPoolView]:
        return [KvPoolView(
            pool=rec.identity.decode(errors="replace"), stats=rec.stats,
            reported_s_ago=max(0.0, now - rec.last_report), paired_workers=rec.paired_workers,
            busy_devices=rec.busy_devices, restore_bytes=rec.restore_bytes, target_bytes=rec.target_bytes,
            shrinks_requested=rec.shrinks_requested, grows_requested=rec.grows_requested)
            for _, rec in sorted(self.pools.items())]
