"""The scheduler core's intake of results: which result a worker sends is taken, and what becomes
of a request whose worker is lost.

A part of `SchedulerCore` (scheduler_core.py). It owns `released`, the requests taken back from
lost workers, remembered so that such a worker's kept result still counts while nobody else has
taken the request. A result is accepted only from the worker that holds the request: its current
assignment (or the request it said it was running when it registered), or a result it kept from
before it registered again (the invariants in scheduler_core.py). A lost worker's request goes
back to its queue here, or fails once it has lost `max_request_attempts` workers.
"""
from __future__ import annotations

import collections
import logging
from typing import Callable, Iterator, Mapping

from specgen.messages import CancelWork, CandidateSubmission, CandidateUpdate, Hello, Verdict, WorkDone, _Wire
from specgen.runtime.job_book import JobState, Key
from specgen.runtime.pools import PoolController
from specgen.runtime.priority import QueuedRequest
from specgen.runtime.settings import RuntimeSettings
from specgen.runtime.worker_registry import WorkerRegistry, WorkerState

log = logging.getLogger("specgen.runtime.scheduler_core")   # one logger for the whole core

_MAX_RELEASED = 1024             # requests taken back from lost workers, remembered for their results


class ResultIntake:
    """The results workers send, and the requests of lost workers."""

    def __init__(
        self,
        settings: RuntimeSettings,
        scheduler_id: str,
        wall: Callable[[], float],
        seq: Iterator[int],
        counters: collections.Counter,
        reply: Callable[[bytes, _Wire], None],
        registry: WorkerRegistry,
        *,
        jobs: Mapping[str, JobState],
        direct: Mapping[Key, QueuedRequest],
        running: dict[str, QueuedRequest],
        pools: PoolController,
        push: Callable[..., None],
        unqueue: Callable[[QueuedRequest], None],
        complete: Callable[[QueuedRequest, CandidateUpdate, float], None],
    ) -> None:
        """`jobs` (the job book's) and `direct` (the assignment policy's one-off requests) say which
        requests still wait for a result; `running` (request id -> request) is the assignment
        policy's, as are `push` and `unqueue` (into and out of the queues); `complete` records a
        result in the job book."""
        self.settings = settings
        self.scheduler_id = scheduler_id
        self.wall = wall
        self.seq = seq
        self.counters = counters
        self.reply = reply
        self.registry = registry
        self.jobs = jobs
        self.direct = direct
        self.running = running
        self.pools = pools
        self.push = push
        self.unqueue = unqueue
        self.complete = complete
        # request id -> (worker name, request) for requests taken back from lost workers: that
        # worker's kept result is still accepted while the request waits in its queue.
        self.released: collections.OrderedDict[str, tuple[str, QueuedRequest]] = collections.OrderedDict()

    def find_live(self, key: Key) -> QueuedRequest | None:
        if key[0] == "":
            return self.direct.get(key)
        job = self.jobs.get(key[0])
        return job.live.get(key) if job is not None else None

    def is_live(self, req: QueuedRequest) -> bool:
        """Still waiting for its result (queued or running)."""
        if req.direct:
            return self.direct.get(req.key) is req
        job = self.jobs.get(req.key[0])
        return job is not None and job.live.get(req.key) is req

    def _issued_here(self, request_id: str) -> bool:
        return request_id.startswith(self.scheduler_id + "-")

    # -- workers that come and go -------------------------------------------------------------
    def adopt(self, w: WorkerState, msg: Hello, now: float) -> None:
        """The worker was running a request when this scheduler (re)started, or when it was taken
        for lost (its Hello's `busy_request_id`): it keeps it."""
        key = tuple(msg.busy_key) if len(msg.busy_key) == 3 else ("", "", "")
        if self._issued_here(msg.busy_request_id):
            # Ours: only if it was this worker's and nobody has taken it since.
            rec = self.released.get(msg.busy_request_id)
            req = rec[1] if rec is not None and rec[0] == msg.name else None
            if req is not None and (req.request_id or req.removed or not self.is_live(req)):
                req = None
            if req is not None:
                del self.released[msg.busy_request_id]
        else:
            req = self.find_live(key)  # type: ignore[arg-type]
            if req is not None and req.request_id in self.running:
                req = None   # already adopted by another worker: this one is a stray duplicate
        if req is not None:
            self.unqueue(req)
        if req is None:
            req = QueuedRequest(
                key=key, stage=key[2] or "validate", seq=next(self.seq), orphan=True,  # type: ignore[arg-type]
                submission=CandidateSubmission(job_id=key[0], candidate_id=key[1], problem_name="",
                                               problem_source="", candidate_source=""))
        req.request_id = msg.busy_request_id
        req.started_at = self.wall()
        self.running[req.request_id] = req
        self.registry.set_busy(w, req, now)

    def release(self, w: WorkerState, reason: str, now: float) -> None:
        """The lost worker `w` held `w.busy`: it goes back to its queue."""
        assert w.busy is not None
        if w.busy.request_id and not w.busy.orphan:
            # If the worker comes back with this result (it was only cut off), the result
            # counts while nobody else has taken the request.
            self.released[w.busy.request_id] = (w.name, w.busy)
            while len(self.released) > _MAX_RELEASED:
                self.released.popitem(last=False)
        self.requeue_lost(w.busy, f"worker {w.name} {reason}", now)

    # -- results ------------------------------------------------------------------------------
    def on_work_done(self, peer: bytes, msg: WorkDone, now: float) -> None:
        # A refused result is acknowledged too: the worker is not to send it again.
        self.registry.owe_ack(peer, msg.call_id)
        upd = msg.update
        rid = msg.request_id
        w = self.registry.workers.get(peer)
        if w is None:
            self._refuse_result(peer, msg, "the peer is not a registered worker")
            return
        served = w.busy
        if served is not None and served.request_id == rid:
            sub = served.submission
            self.registry.set_idle(w)
            self.running.pop(rid, None)
            if (upd.job_id, upd.candidate_id, upd.stage) != (sub.job_id, sub.candidate_id, served.stage):
                self._refuse_result(peer, msg, f"its update is for {upd.job_id}/{upd.candidate_id} "
                                               f"{upd.stage}, not for the request's candidate")
                if not served.orphan and self.is_live(served):
                    self.requeue_lost(served, f"worker {w.name} answered it for another candidate", now)
                return
            w.completed += 1
            w.recent.append(rid)
            if not served.orphan:
                self.pools.record_service(served.pool, max(0.0, upd.finished_at - upd.started_at))
            if w.pending_pool:
                self.registry.set_pool(w, w.pending_pool)
                self.counters["reassignments"] += 1
            if served.orphan:
                self._kept_result(w, msg, now)
            elif self.is_live(served):
                self.complete(served, upd, now)
            else:
                self.counters["duplicates_ignored"] += 1   # dropped meanwhile, or answered elsewhere
            return
        if rid in w.held:
            w.held.discard(rid)
            w.recent.append(rid)
            self._kept_result(w, msg, now)
            return
        if rid in w.recent:
            self.counters["duplicates_ignored"] += 1   # answered before (a re-send)
            return
        if rid in self.running:
            why = "the request is assigned to another worker"
        elif self._issued_here(rid):
            why = "the request was never assigned to it, or was taken back from it"
        else:
            why = "no such request is running"
        self._refuse_result(peer, msg, why)

    def _kept_result(self, w: WorkerState, msg: WorkDone, now: float) -> None:
        """A result of a request this worker held but that is not (or no longer) booked as its
        assignment: from before a scheduler restart, or of a request taken back from it when it
        was lost. It counts unless the request has been given to another worker since."""
        upd, rid = msg.update, msg.request_id
        if self._issued_here(rid):
            rec = self.released.get(rid)
            if rec is None or rec[0] != w.name:
                self._refuse_result(w.peer, msg, "the request was never assigned to it")
                return
            req = rec[1]
            if not self.is_live(req):
                self.counters["duplicates_ignored"] += 1
                return
            if req.request_id:
                if w.busy is not req:
                    self._refuse_result(w.peer, msg, "the request was given to another worker after "
                                                     "this one was taken for lost")
                    return
                # Given back to this same worker when it registered again: the result it kept
                # counts, and the new attempt is stopped (its answer is then ignored).
                self.running.pop(req.request_id, None)
                self.reply(w.peer, CancelWork(request_id=req.request_id))
            else:
                self.unqueue(req)
            del self.released[rid]
        else:
            # Assigned by an earlier scheduler, whose books are gone: the journal knows the key.
            req = self.find_live((upd.job_id, upd.candidate_id, upd.stage))
            if req is None:
                self.counters["duplicates_ignored"] += 1
                return
            if req.request_id and req.request_id in self.running:
                # Also running elsewhere (adopted after a restart): this result wins.
                self.running.pop(req.request_id)
                for other in self.registry.workers.values():
                    if other.busy is req:
                        self.reply(other.peer, CancelWork(request_id=req.request_id))
            else:
                self.unqueue(req)
        self.complete(req, upd, now)

    def _refuse_result(self, peer: bytes, msg: WorkDone, why: str) -> None:
        self.counters["results_refused"] += 1
        known = self.registry.peers.get(peer)
        upd = msg.update
        log.warning("refused a result from %s %r (peer %r) for request %r (%s/%s %s): %s",
                    known.role if known else "peer", known.name if known else "?", peer[:40],
                    msg.request_id, upd.job_id, upd.candidate_id, upd.stage, why)

    def requeue_lost(self, req: QueuedRequest, reason: str, now: float) -> None:
        self.running.pop(req.request_id, None)
        if req.orphan:
            return   # nobody here wants its result
        req.attempts += 1
        req.request_id = ""
        if req.attempts >= self.settings.max_request_attempts:
            self.counters["requests_failed"] += 1
            upd = CandidateUpdate(
                job_id=req.key[0], candidate_id=req.key[1] if not req.direct else req.submission.candidate_id,
                stage=req.stage, finished_at=self.wall(),
                # A candidate whose evaluation keeps killing its worker is failed as the
                # candidate's doing, not retried on every worker of the pool.
                verdict=Verdict(stage=req.stage, code="candidate", error=(
                    f"evaluation lost its worker {req.attempts} times (setting max_request_attempts); "
                    f"last: {reason}")))
            self.complete(req, upd, now)
            return
        self.counters["requests_requeued"] += 1
        log.info("re-queued %s after %s", req.key, reason)
        self.push(req, now, count_arrival=False)
