"""The scheduler core's assignment policy: the queues of requests (by the priority rule), which
idle worker takes which request, the split of workers between the validation and profiling pools,
and the KV pools' resizes that go with an assignment pass.

Part of `SchedulerCore` (scheduler_core.py), which composes it with the worker registry
(worker_registry.py) and the job book (job_book.py); all three share one state on the core. This
part owns `queues`, `running`, `direct` (one-off requests), the pool controller and usage meter
(pools.py), and the KV steward (kv_steward.py).
"""
from __future__ import annotations

import heapq
import itertools
import logging
import math

from specgen.messages import (
    AssignWork, EvaluateQueued, EvaluateRequest, ErrorReply, KvPoolResize, KvPoolStats,
)
from specgen.runtime.job_book import Key
from specgen.runtime.kv_steward import KvPoolSteward, WorkerPlacement, device_index
from specgen.runtime.pools import PoolController, UsageMeter
from specgen.runtime.priority import POOLS, PriorityRule, QueuedRequest, RequestQueue
from specgen.runtime.worker_registry import WorkerState

log = logging.getLogger("specgen.runtime.scheduler_core")   # one logger for the whole core

_MIN_PROGRESS_INTERVAL_S = 0.1   # EvaluateQueued notices to one caller about one request, at most this often


class AssignmentPolicy:
    """Queues, assignment, the pools' split, KV steering (a mixin of `SchedulerCore`).

    Uses from the core: `settings`, `journal`, `scheduler_id`, `clock` and `wall`, `seq`,
    `counters`, `actions`, `reply()`; the job book's `jobs`, `_drop`; the worker registry's `peers`,
    `workers`, `work_acks`.
    """

    def init_requests(self) -> None:
        self.running: dict[str, QueuedRequest] = {}    # request_id -> request
        self.direct: dict[Key, QueuedRequest] = {}     # one-off requests, queued or running
        self.progress_due: list[tuple[float, int, bool, Key]] = []   # (when, seq, first, key): _report_progress
        self.request_ids = itertools.count(1)

    def init_pools(self, now: float) -> None:
        self.rule = PriorityRule(self.settings.priority_rule)
        self.queues = {p: RequestQueue(self.rule) for p in POOLS}
        self.pools = PoolController(self.settings)
        self.lending = self.pools.elastic and self.settings.lend_idle_workers
        self.usage = UsageMeter(now)
        s = self.settings
        self.kv = KvPoolSteward(s.kv_reserve_bytes, s.kv_regrow_idle_s, s.kv_pool_timeout_s)
        self.kv_outbox: list[tuple[bytes, KvPoolResize]] = []   # (pool identity, request)
        self.kv_endpoint = ""                                    # set by the actor once bound
        self._placements: tuple[int, list[WorkerPlacement]] = (-1, [])   # (workers_version, list)

    # -- requests ---------------------------------------------------------------------------
    def _queued(self) -> dict[str, int]:
        return {p: len(self.queues[p]) for p in POOLS}

    def _total_queued(self) -> int:
        return self.queues["validate"].live + self.queues["profile"].live   # called per message

    def _find_live(self, key: Key) -> QueuedRequest | None:
        if key[0] == "":
            return self.direct.get(key)
        job = self.jobs.get(key[0])
        return job.live.get(key) if job is not None else None

    def _is_live(self, req: QueuedRequest) -> bool:
        """Still waiting for its result (queued or running)."""
        if req.direct:
            return self.direct.get(req.key) is req
        job = self.jobs.get(req.key[0])
        return job is not None and job.live.get(req.key) is req

    def _unqueue(self, req: QueuedRequest) -> None:
        self.queues[req.pool].remove(req)

    def _push(self, req: QueuedRequest, now: float, count_arrival: bool = True) -> None:
        req.enqueued_at = now
        self.queues[req.pool].push(req)
        if count_arrival:
            self.pools.record_arrival(req.pool, now)

    def on_evaluate(self, peer: bytes, msg: EvaluateRequest, now: float) -> None:
        if msg.stage not in ("validate", "profile", "full"):
            self.reply(peer, ErrorReply(code="bad_request", ref=msg.call_id,
                                        message=f"stage must be validate, profile or full, not {msg.stage!r}"))
            return
        key = ("", f"direct:{peer.hex()}:{msg.call_id}", msg.stage)
        if key in self.direct:
            return   # the same request re-sent after a re-registration: one answer will come
        if self._total_queued() >= self.settings.max_queued_requests:
            self.reply(peer, ErrorReply(code="busy", ref=msg.call_id, message=(
                f"{self._total_queued()} requests queued (setting max_queued_requests); retry later")))
            return
        sub = msg.submission
        req = QueuedRequest(key=key, stage=msg.stage, submission=sub, seq=next(self.seq),
                            deadline=sub.deadline or math.inf, reply_to=peer, call_id=msg.call_id,
                            direct=True)
        self.direct[key] = req
        self._push(req, now)
        if msg.progress_interval_s > 0:
            # Acknowledged once this pass's assignments are made: only if it is still queued then.
            req.progress_interval_s = max(_MIN_PROGRESS_INTERVAL_S, msg.progress_interval_s)
            heapq.heappush(self.progress_due, (now, req.seq, True, key))

    def _report_progress(self, now: float) -> None:
        """Tell callers that their one-off requests are alive: EvaluateQueued with the queue
        position when a request is queued (not when a worker took it at once), then every
        `progress_interval_s` it asked for, queued or running, until it is answered. The caller's
        wait for the reply restarts with each (setting call_timeout_s)."""
        due = self.progress_due
        while due and due[0][0] <= now:
            _, seq, first, key = heapq.heappop(due)
            req = self.direct.get(key)
            if req is None or req.seq != seq or req.reply_to is None:
                continue   # answered or dropped
            peer, queue = req.reply_to, self.queues[req.pool]
            if peer not in self.peers:
                pass   # timed out while a worker runs its request: told again once it is back
            elif not req.removed:
                self.reply(peer, EvaluateQueued(call_id=req.call_id, position=queue.position(req),
                                                queued=queue.live))
            elif not first and req.request_id and self.running.get(req.request_id) is req:
                self.reply(peer, EvaluateQueued(call_id=req.call_id, running=True, queued=queue.live))
            heapq.heappush(due, (now + req.progress_interval_s, seq, False, key))

    # -- assignment and pools ---------------------------------------------------------------
    def schedule(self, now: float) -> int:
        """Give queued requests to idle workers; returns how many were assigned.

        A worker takes the best head (by the priority rule) of its own pool's queue and, when
        lending, of the other pool's queue, but only while no worker of that other pool is idle
        to take it itself. Only idle workers with something to take are visited, so a call costs
        nothing per worker when nothing is queued.
        """
        assigned = 0
        if self._total_queued():
            wall = self.wall()
            progress = True
            while progress and self._total_queued():
                progress = False
                for pool in POOLS:
                    other = "profile" if pool == "validate" else "validate"
                    for w in list(self.idle[pool].values()):
                        lend = self.lending and not self.idle[other]
                        if not self.queues[pool].live and not (lend and self.queues[other].live):
                            break     # nothing left that a worker of this pool may take
                        req = self._pick(w, wall, lend=lend)
                        if req is None:
                            continue
                        self._assign(w, req, now, wall)
                        assigned += 1
                        progress = True
        if self.progress_due and self.progress_due[0][0] <= now:
            self._report_progress(now)
        self._refresh_usage()
        self.steer_kv(now)
        return assigned

    def _pick(self, w: WorkerState, wall: float, lend: bool) -> QueuedRequest | None:
        own = self.queues[w.pool]
        other = self.queues["profile" if w.pool == "validate" else "validate"] if lend else None
        while True:
            a = own.peek()
            b = other.peek() if other is not None else None
            if a is None and b is None:
                return None
            if b is None or (a is not None and self.rule.full_key(a, w.pool) <= self.rule.full_key(b, w.pool)):
                req, queue = a, own
            else:
                req, queue = b, other
            queue.pop()  # type: ignore[union-attr]
            assert req is not None
            if req.deadline < wall:
                self._drop(req, "its deadline passed before a worker was free")
                continue
            if not req.direct:
                job = self.jobs.get(req.key[0])
                if job is None or job.state != "running":
                    self.counters["requests_dropped"] += 1
                    continue
            return req

    def _assign(self, w: WorkerState, req: QueuedRequest, now: float, wall: float) -> None:
        req.request_id = f"{self.scheduler_id}-{next(self.request_ids)}"
        req.started_at = wall
        self._set_busy(w, req, now)
        self.running[req.request_id] = req
        self.reply(w.peer, AssignWork(request_id=req.request_id, stage=req.stage, submission=req.submission,
                                      acked=self.work_acks.pop(w.peer, [])))

    def rebalance(self, now: float) -> None:
        workers = list(self.workers.values())
        n = len(workers)
        if n == 0:
            return
        validators = sum(1 for w in workers if w.future_pool == "validate")
        if self.pools.elastic:
            donor = self.pools.move(now, n, validators, self._queued())
            if donor is None:
                return
            moves = [(donor, "profile" if donor == "validate" else "validate")]
        else:
            target = self.pools.static_validators(n)
            if validators == target:
                return
            src, dst = ("validate", "profile") if validators > target else ("profile", "validate")
            moves = [(src, dst)] * abs(validators - target)
        for src, dst in moves:
            candidates = [w for w in workers if w.future_pool == src]
            if not candidates:
                return
            idle = [w for w in candidates if w.busy is None]
            w = idle[0] if idle else min(candidates, key=lambda w: w.busy_since)
            if w.busy is None:
                self._set_pool(w, dst)
                self.counters["reassignments"] += 1
            else:
                w.pending_pool = dst if dst != w.pool else None
            self.pools.last_move = now
            log.info("pool change: %s %s -> %s%s", w.name, src, dst, "" if w.busy is None else " (after its request)")

    def _refresh_usage(self) -> None:
        u = self.usage
        for p in POOLS:
            u.workers[p] = self.pool_size[p]
            u.busy_now[p] = self.pool_size[p] - len(self.idle[p])
        u.queued_now = self._total_queued()

    # -- remote KV pools ----------------------------------------------------------------------
    def on_kv_stats(self, identity: bytes, stats: KvPoolStats, now: float) -> None:
        self.kv.on_stats(identity, stats, now)

    def kv_send_failed(self, identity: bytes) -> None:
        self.kv.send_failed(identity)

    def steer_kv(self, now: float) -> None:
        """Queue the resizes the pools are due: room on a GPU while its workers evaluate, given
        back once they are idle (in the same pass that assigned the work, so both go out together)."""
        if not self.kv.pools:
            return
        if self._placements[0] != self.workers_version:
            self._placements = (self.workers_version, [
                WorkerPlacement(name=w.name, host=w.host, device=device_index(w.device), busy=w.busy is not None)
                for w in self.workers.values()])
        self.kv_outbox.extend(self.kv.steer(self._placements[1], now))
