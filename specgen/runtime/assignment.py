"""The scheduler core's assignment policy: the queues of requests (by the priority rule), which
idle worker takes which request, the split of workers between the validation and profiling pools,
and the KV pools' resizes that go with an assignment pass.

A part of `SchedulerCore` (scheduler_core.py). It owns `queues`, `running` (the requests workers
hold), `direct` (one-off requests, `EvaluateRequest`: they belong to no job and are answered
straight to their caller), the pool controller (pools.py) and the KV steward (kv_steward.py). It
reads and moves workers through the worker registry's index, and keeps the usage meter the core
hands it up to date.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
from typing import Callable, Iterator

from specgen.messages import (
    AssignWork, CandidateUpdate, EvaluateQueued, EvaluateReply, EvaluateRequest, ErrorReply, KvPoolResize,
    _Wire,
)
from specgen.runtime.job_book import Key
from specgen.runtime.kv_steward import KvPoolSteward, WorkerPlacement, device_index
from specgen.runtime.pools import PoolController, UsageMeter
from specgen.runtime.priority import POOLS, PriorityRule, QueuedRequest, RequestQueue
from specgen.runtime.settings import RuntimeSettings
from specgen.runtime.worker_registry import WorkerRegistry, WorkerState

log = logging.getLogger("specgen.runtime.scheduler_core")   # one logger for the whole core

_MIN_PROGRESS_INTERVAL_S = 0.1   # EvaluateQueued notices to one caller about one request, at most this often


class AssignmentPolicy:
    """Queues, assignment, the pools' split, KV steering."""

    def __init__(
        self,
        settings: RuntimeSettings,
        scheduler_id: str,
        wall: Callable[[], float],
        seq: Iterator[int],
        counters: collections.Counter,
        usage: UsageMeter,
        reply: Callable[[bytes, _Wire], None],
        registry: WorkerRegistry,
        *,
        job_running: Callable[[str], bool],
        drop: Callable[[QueuedRequest, str], None],
    ) -> None:
        """`job_running(job_id)`: whether the job still wants its requests run (a job's queued
        request is skipped once it ended); `drop(request, reason)`: answer a request that will never
        run (the job book records it)."""
        self.settings = settings
        self.scheduler_id = scheduler_id
        self.wall = wall
        self.seq = seq
        self.counters = counters
        self.usage = usage
        self.reply = reply
        self.registry = registry
        self.job_running = job_running
        self.drop = drop
        self.running: dict[str, QueuedRequest] = {}    # request_id -> request
        self.direct: dict[Key, QueuedRequest] = {}     # one-off requests, queued or running
        self.progress_due: list[tuple[float, int, bool, Key]] = []   # (when, seq, first, key): _report_progress
        self.request_ids = itertools.count(1)
        self.rule = PriorityRule(settings.priority_rule)
        self.queues = {p: RequestQueue(self.rule) for p in POOLS}
        self.pools = PoolController(settings)
        self.lending = self.pools.elastic and settings.lend_idle_workers
        s = settings
        self.kv = KvPoolSteward(s.kv_reserve_bytes, s.kv_regrow_idle_s, s.kv_pool_timeout_s)
        self._placements: tuple[int, list[WorkerPlacement]] = (-1, [])   # (workers_version, list)

    # -- requests ---------------------------------------------------------------------------
    def queued(self) -> dict[str, int]:
        return {p: len(self.queues[p]) for p in POOLS}

    def total_queued(self) -> int:
        return self.queues["validate"].live + self.queues["profile"].live   # called per message

    def unqueue(self, req: QueuedRequest) -> None:
        self.queues[req.pool].remove(req)

    def push(self, req: QueuedRequest, now: float, count_arrival: bool = True) -> None:
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
        if self.total_queued() >= self.settings.max_queued_requests:
            self.reply(peer, ErrorReply(code="busy", ref=msg.call_id, message=(
                f"{self.total_queued()} requests queued (setting max_queued_requests); retry later")))
            return
        sub = msg.submission
        req = QueuedRequest(key=key, stage=msg.stage, submission=sub, seq=next(self.seq),
                            deadline=sub.deadline or math.inf, reply_to=peer, call_id=msg.call_id,
                            direct=True)
        self.direct[key] = req
        self.push(req, now)
        if msg.progress_interval_s > 0:
            # Acknowledged once this pass's assignments are made: only if it is still queued then.
            req.progress_interval_s = max(_MIN_PROGRESS_INTERVAL_S, msg.progress_interval_s)
            heapq.heappush(self.progress_due, (now, req.seq, True, key))

    def answer_direct(self, req: QueuedRequest, upd: CandidateUpdate) -> None:
        """A one-off evaluation (no job) is answered to its caller, if it still waits."""
        self.direct.pop(req.key, None)
        if req.reply_to is not None:
            self.reply(req.reply_to, EvaluateReply(call_id=req.call_id, update=upd))

    def drop_calls_of(self, peer: bytes) -> None:
        """One-off requests of a caller that is gone: nobody will read the answer."""
        for req in [r for r in self.direct.values() if r.reply_to == peer and not r.removed]:
            self.unqueue(req)
            del self.direct[req.key]
            self.counters["requests_dropped"] += 1

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
            if peer not in self.registry.peers:
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
        nothing per worker when nothing is queued. The KV pools' resizes that go with the pass
        are the core's to ask (`steer_kv`).
        """
        assigned = 0
        if self.total_queued():
            wall = self.wall()
            # A pool with no worker at all (one worker, split statically) would hold its work
            # forever: the other pool's workers take it, in either mode.
            staffed = {pool: False for pool in POOLS}
            for w in self.registry.workers.values():
                staffed[w.pool] = True
            progress = True
            while progress and self.total_queued():
                progress = False
                idle = self.registry.idle
                for pool in POOLS:
                    other = "profile" if pool == "validate" else "validate"
                    for w in list(idle[pool].values()):
                        lend = (self.lending or not staffed[other]) and not idle[other]
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
                self.drop(req, "its deadline passed before a worker was free")
                continue
            if not req.direct and not self.job_running(req.key[0]):
                self.counters["requests_dropped"] += 1
                continue
            return req

    def _assign(self, w: WorkerState, req: QueuedRequest, now: float, wall: float) -> None:
        req.request_id = f"{self.scheduler_id}-{next(self.request_ids)}"
        req.started_at = wall
        self.registry.set_busy(w, req, now)
        self.running[req.request_id] = req
        self.reply(w.peer, AssignWork(request_id=req.request_id, stage=req.stage, submission=req.submission,
                                      acked=self.registry.take_acks(w.peer)))

    def place_worker(self, now: float) -> str:
        """The pool a worker that registers now joins."""
        workers = self.registry.workers
        n = len(workers) + 1
        validators = sum(1 for w in workers.values() if w.future_pool == "validate")
        if self.pools.elastic:
            target = self.pools.target_validators(now, n, self.queued())
            target = n / 2 if target is None else target
            return "validate" if validators < round(target) or validators == 0 else "profile"
        return "validate" if validators < self.pools.static_validators(n) else "profile"

    def rebalance(self, now: float) -> None:
        workers = list(self.registry.workers.values())
        n = len(workers)
        if n == 0:
            return
        validators = sum(1 for w in workers if w.future_pool == "validate")
        if self.pools.elastic:
            donor = self.pools.move(now, n, validators, self.queued())
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
                self.registry.set_pool(w, dst)
                self.counters["reassignments"] += 1
            else:
                w.pending_pool = dst if dst != w.pool else None
            self.pools.last_move = now
            log.info("pool change: %s %s -> %s%s", w.name, src, dst, "" if w.busy is None else " (after its request)")

    def _refresh_usage(self) -> None:
        u, pool_size, idle = self.usage, self.registry.pool_size, self.registry.idle
        for p in POOLS:
            u.workers[p] = pool_size[p]
            u.busy_now[p] = pool_size[p] - len(idle[p])
        u.queued_now = self.total_queued()

    # -- remote KV pools ----------------------------------------------------------------------
    def steer_kv(self, now: float) -> list[tuple[bytes, KvPoolResize]]:
        """The resizes the pools are due, (pool identity, request): room on a GPU while its workers
        evaluate, given back once they are idle (asked in the same pass that assigned the work, so
        both go out together)."""
        if not self.kv.pools:
            return []
        version = self.registry.workers_version
        if self._placements[0] != version:
            self._placements = (version, [
                WorkerPlacement(name=w.name, host=w.host, device=device_index(w.device), busy=w.busy is not None)
                for w in self.registry.workers.values()])
        return self.kv.steer(self._placements[1], now)
