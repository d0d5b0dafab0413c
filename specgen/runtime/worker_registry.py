"""The scheduler core's peers and workers: who is registered, who is alive, which request each
worker holds, and whose results are taken.

Part of `SchedulerCore` (scheduler_core.py), which composes it with the job book (job_book.py)
and the assignment policy (assignment.py); all three share one state on the core. This part owns
`peers`, `workers`, `work_acks`, `released`, and an index of the workers kept up to date as they
change (`idle` per pool, `pool_size`, `workers_version`), so that a scheduling decision costs the
same with 8 workers or 500: a worker's `busy` and `pool` change only through `_set_busy`,
`_set_idle` and `_set_pool`. A lost worker's request goes back to its queue here
(`_requeue_lost`), and a result is accepted only from the worker that holds the request (the
invariants in scheduler_core.py).
"""
from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field

from specgen.messages import (
    PROTOCOL_VERSION, CancelWork, CandidateSubmission, CandidateUpdate, DeadNotice, ErrorReply, Goodbye,
    Heartbeat, HeartbeatAck, Hello, Verdict, Welcome, WorkDone, WorkerExited,
)
from specgen.runtime.auth import ADMIN_ROLE, AUTHENTICATED_ROLES, check_credential
from specgen.runtime.ownership import MIN_TOKEN_CHARS, identity_of
from specgen.runtime.priority import POOLS, QueuedRequest

log = logging.getLogger("specgen.runtime.scheduler_core")   # one logger for the whole core

ROLES = ("client", "worker", "node", "reasoner")
_MAX_HELD_RESULTS = 256          # kept results a worker may list in its Hello
_MAX_RELEASED = 1024             # requests taken back from lost workers, remembered for their results
_RECENT_RESULTS = 16             # request ids a worker answered lately (a repeat is a duplicate)


@dataclass(slots=True)
class Peer:
    id: bytes
    role: str
    name: str
    last_seen: float
    health: dict = field(default_factory=dict)
    owner: str = ""                  # the identity its jobs belong to (runtime/ownership.py)
    curve_key: str | None = None     # the CURVE key it registered with (None: CURVE is off)
    admin: bool = False              # a client that presented the admin credential


@dataclass(slots=True)
class WorkerState:
    peer: bytes
    name: str
    node: str
    device: str
    pool: str
    busy: QueuedRequest | None = None
    busy_since: float = 0.0
    completed: int = 0
    pending_pool: str | None = None
    pid: int = 0
    host: str = ""
    sandbox: str = ""                               # how its candidates run (Hello.sandbox)
    held: set[str] = field(default_factory=set)     # kept results it listed in its Hello
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=_RECENT_RESULTS))

    @property
    def future_pool(self) -> str:
        return self.pending_pool or self.pool


class WorkerRegistry:
    """Peers, workers, liveness, and the results workers send (a mixin of `SchedulerCore`).

    Uses from the core: `settings`, `journal`, `scheduler_id`, `clock` and `wall`, `seq`,
    `counters`, `actions`, `reply()`; the job book's `jobs`, `_emit`, `_complete`; the assignment
    policy's `running`, `direct`, `pools`, `_queued`, `_push`, `_unqueue`, `_find_live`, `_is_live`.
    """

    def init_peers(self) -> None:
        self.peers: collections.OrderedDict[bytes, Peer] = collections.OrderedDict()   # least recently heard first
        self.workers: dict[bytes, WorkerState] = {}
        self.work_acks: dict[bytes, list[int]] = {}     # worker -> WorkDone call_ids not yet acked
        # request id -> (worker name, request) for requests taken back from lost workers: that
        # worker's kept result is still accepted while the request waits in its queue.
        self.released: collections.OrderedDict[str, tuple[str, QueuedRequest]] = collections.OrderedDict()
        self._refusals_logged: dict[str, float] = {}     # peer name -> last refused-Hello warning
        self.idle: dict[str, dict[bytes, WorkerState]] = {p: {} for p in POOLS}   # longest idle first
        self.pool_size = dict.fromkeys(POOLS, 0)
        self.workers_version = 0     # changes whenever a worker comes, goes, takes or ends work, moves

    # -- the workers' index -----------------------------------------------------------------
    def _enlist(self, w: WorkerState) -> None:
        self.workers[w.peer] = w
        self.pool_size[w.pool] += 1
        if w.busy is None:
            self.idle[w.pool][w.peer] = w
        self.workers_version += 1

    def _delist(self, peer: bytes) -> WorkerState | None:
        w = self.workers.pop(peer, None)
        if w is not None:
            self.pool_size[w.pool] -= 1
            self.idle[w.pool].pop(peer, None)
            self.workers_version += 1
        return w

    def _set_busy(self, w: WorkerState, req: QueuedRequest, now: float) -> None:
        w.busy, w.busy_since = req, now
        self.idle[w.pool].pop(w.peer, None)
        self.workers_version += 1

    def _set_idle(self, w: WorkerState) -> None:
        w.busy = None
        self.idle[w.pool][w.peer] = w
        self.workers_version += 1

    def _set_pool(self, w: WorkerState, pool: str) -> None:
        w.pending_pool = None
        if pool == w.pool:
            return
        self.pool_size[w.pool] -= 1
        idle = self.idle[w.pool].pop(w.peer, None)
        w.pool = pool
        self.pool_size[pool] += 1
        if idle is not None:
            self.idle[pool][w.peer] = w
        self.workers_version += 1

    def _touch(self, known: Peer, now: float) -> None:
        # Peers stay ordered by when they were last heard from, so expiry reads only the silent ones.
        known.last_seen = now
        self.peers.move_to_end(known.id)

    def _expire_peers(self, now: float) -> None:
        timeout = self.settings.peer_timeout_s
        silent = []
        for p in self.peers.values():
            if now - p.last_seen <= timeout:
                break
            silent.append(p)
        for peer in silent:
            self._peer_lost(peer.id, f"silent for more than {timeout:g} s (setting peer_timeout_s)", now)

    # -- peers ------------------------------------------------------------------------------
    def on_hello(self, peer: bytes, msg: Hello, now: float, curve_key: str | None = None) -> None:
        """`curve_key`: the sender's CURVE public key as ZAP authenticated it (None: CURVE is off)."""
        if msg.protocol_version != PROTOCOL_VERSION:
            self.reply(peer, ErrorReply(code="version", message=(
                f"protocol version {msg.protocol_version} is not supported (scheduler speaks "
                f"{PROTOCOL_VERSION}); run the same specgen version everywhere")))
            return
        if msg.role not in ROLES:
            self.reply(peer, ErrorReply(code="bad_role", message=f"unknown role {msg.role!r}; one of {ROLES}"))
            return
        if msg.role in AUTHENTICATED_ROLES and self.join_secret is not None:
            node = msg.node if msg.role == "worker" else ""
            if not check_credential(self.join_secret, msg.role, msg.name, node, msg.credential):
                self._refuse_hello(peer, msg, now)
                return
        if msg.role == "reasoner" and msg.name not in self.jobs:
            self.reply(peer, ErrorReply(code="unknown_job", message=f"no running job {msg.name!r}"))
            return
        if msg.client_token and len(msg.client_token) < MIN_TOKEN_CHARS:
            self.reply(peer, ErrorReply(code="bad_request", message=(
                f"Hello.client_token has {len(msg.client_token)} characters: a token names the owner "
                f"of jobs, so it needs {MIN_TOKEN_CHARS} or more random ones (secrets.token_hex(16))")))
            return
        owner = identity_of(curve_key, msg.client_token, peer)
        admin = msg.role == "client" and self._is_admin(peer, msg, now)
        known = self.peers.get(peer)
        if known is not None and ((known.role, known.name, known.owner, known.admin)
                                  != (msg.role, msg.name, owner, admin)):
            # The same connection registering as someone else: it starts over as that one
            # (a client's connection never keeps a client's registration while acting as a
            # worker, nor the jobs' subscriptions of another identity).
            self._peer_lost(peer, f"registered again as {msg.role} {msg.name}", now)
            known = None
        if known is None:
            # Another live peer with the same worker name is an older incarnation: it is gone.
            if msg.role == "worker":
                for other in [w for w in self.workers.values() if w.name == msg.name]:
                    self._peer_lost(other.peer, "replaced by a new process of the same name", now)
            known = Peer(id=peer, role=msg.role, name=msg.name, last_seen=now, owner=owner,
                         curve_key=curve_key, admin=admin)
            self.peers[peer] = known
            log.info("%s %s joined", msg.role, msg.name)
        self._touch(known, now)
        if msg.role == "worker" and peer not in self.workers:
            self._add_worker(peer, msg, now)
        elif msg.role == "reasoner":
            job = self.jobs[msg.name]
            if job.reasoner_peer != peer:
                job.reasoner_peer = peer
                job.submitter = peer
                job.subscribers.discard(peer)
                self._emit(job, "reasoner_started", {"attempt": job.attempts, "pid": msg.pid})
        self.reply(peer, Welcome(
            scheduler_id=self.scheduler_id,
            heartbeat_interval_s=self.settings.heartbeat_interval_s,
            peer_timeout_s=self.settings.peer_timeout_s,
            max_message_bytes=self.settings.max_message_bytes,
            admin=admin,
        ))

    def _is_admin(self, peer: bytes, msg: Hello, now: float) -> bool:
        """A client's Hello with the admin credential of its name. A wrong one does not refuse the
        client (anyone may be a plain client): Welcome.admin tells it, and the warning is logged."""
        if not msg.credential:
            return False
        if self.join_secret is None:   # a core driven by tests: credentials are not checked
            return True
        if check_credential(self.join_secret, ADMIN_ROLE, msg.name, "", msg.credential):
            return True
        last = self._refusals_logged.get(msg.name)
        if last is None or now - last > 60.0:
            if len(self._refusals_logged) > 1000:
                self._refusals_logged.clear()
            self._refusals_logged[msg.name] = now
            log.warning("client %r (peer %r) presented a wrong admin credential: registered as a "
                        "plain client", msg.name, peer[:40])
        return False

    def _refuse_hello(self, peer: bytes, msg: Hello, now: float) -> None:
        self.counters["hellos_refused"] += 1
        what = "no credential" if not msg.credential else "a wrong credential"
        # One warning per name a minute: a misconfigured node retries every second.
        last = self._refusals_logged.get(msg.name)
        if last is None or now - last > 60.0:
            if len(self._refusals_logged) > 1000:
                self._refusals_logged.clear()
            self._refusals_logged[msg.name] = now
            log.warning("refused %s %r (peer %r): %s", msg.role, msg.name, peer[:40], what)
        self.reply(peer, ErrorReply(code="unauthorized", message=(
            f"{msg.role} {msg.name!r}: {what}; workers, nodes and reasoners need a credential "
            "derived from the cluster's join secret (specgen-node --join-secret FILE, the file "
            "`specgen serve --join-secret` names; default STATE_DIR/join_secret)")))

    def on_heartbeat(self, peer: bytes, msg: Heartbeat, now: float) -> None:
        if msg.health:
            self.peers[peer].health = msg.health
        self.reply(peer, HeartbeatAck(scheduler_id=self.scheduler_id, acked=self.work_acks.pop(peer, [])))

    def on_goodbye(self, peer: bytes, msg: Goodbye, now: float) -> None:
        self._peer_lost(peer, f"left: {msg.reason or 'goodbye'}", now)

    def on_dead_notice(self, peer: bytes, msg: DeadNotice, now: float) -> None:
        log.warning("%s reported a fatal error: %s", msg.name, msg.reason)
        self._peer_lost(peer, f"fatal error: {msg.reason}", now)

    def on_worker_exited(self, peer: bytes, msg: WorkerExited, now: float) -> None:
        node = self.peers[peer].name   # a node speaks for its own workers only
        for w in [w for w in self.workers.values() if w.name == msg.name and w.node == node]:
            self._peer_lost(w.peer, f"process exited with code {msg.exit_code} {msg.reason}".strip(), now)

    def _peer_lost(self, peer: bytes, reason: str, now: float) -> None:
        known = self.peers.pop(peer, None)
        self.work_acks.pop(peer, None)
        if known is not None:
            log.info("%s %s lost: %s", known.role, known.name, reason)
        w = self._delist(peer)
        if w is not None and w.busy is not None:
            if w.busy.request_id and not w.busy.orphan:
                # If the worker comes back with this result (it was only cut off), the result
                # counts while nobody else has taken the request.
                self.released[w.busy.request_id] = (w.name, w.busy)
                while len(self.released) > _MAX_RELEASED:
                    self.released.popitem(last=False)
            self._requeue_lost(w.busy, f"worker {w.name} {reason}", now)
        for job in self.jobs.values():
            job.subscribers.discard(peer)
            if job.reasoner_peer == peer:
                job.reasoner_peer = None
                self._watch_reasoner(job)   # it has ready_timeout_s from its start to come back
            if job.submitter == peer:
                job.submitter = None
        # One-off requests of a caller that is gone: nobody will read the answer.
        if known is not None and known.role in ("client", "reasoner"):
            for req in [r for r in self.direct.values() if r.reply_to == peer and not r.removed]:
                self._unqueue(req)
                del self.direct[req.key]
                self.counters["requests_dropped"] += 1

    def _add_worker(self, peer: bytes, msg: Hello, now: float) -> None:
        n = len(self.workers) + 1
        validators = sum(1 for w in self.workers.values() if w.future_pool == "validate")
        if self.pools.elastic:
            target = self.pools.target_validators(now, n, self._queued())
            target = n / 2 if target is None else target
            pool = "validate" if validators < round(target) or validators == 0 else "profile"
        else:
            pool = "validate" if validators < self.pools.static_validators(n) else "profile"
        w = WorkerState(peer=peer, name=msg.name, node=msg.node, device=msg.device or "cpu", pool=pool,
                        pid=msg.pid, host=msg.host, sandbox=msg.sandbox)
        w.held.update(msg.held_results[:_MAX_HELD_RESULTS])
        self._enlist(w)
        if msg.busy_request_id:
            # The worker was running a request when this scheduler (re)started, or when it was
            # taken for lost: adopt it.
            key = tuple(msg.busy_key) if len(msg.busy_key) == 3 else ("", "", "")
            if self._issued_here(msg.busy_request_id):
                # Ours: only if it was this worker's and nobody has taken it since.
                rec = self.released.get(msg.busy_request_id)
                req = rec[1] if rec is not None and rec[0] == msg.name else None
                if req is not None and (req.request_id or req.removed or not self._is_live(req)):
                    req = None
                if req is not None:
                    del self.released[msg.busy_request_id]
            else:
                req = self._find_live(key)  # type: ignore[arg-type]
                if req is not None and req.request_id in self.running:
                    req = None   # already adopted by another worker: this one is a stray duplicate
            if req is not None:
                self._unqueue(req)
            if req is None:
                req = QueuedRequest(
                    key=key, stage=key[2] or "validate", seq=next(self.seq), orphan=True,  # type: ignore[arg-type]
                    submission=CandidateSubmission(job_id=key[0], candidate_id=key[1], problem_name="",
                                                   problem_source="", candidate_source=""))
            req.request_id = msg.busy_request_id
            req.started_at = self.wall()
            self.running[req.request_id] = req
            self._set_busy(w, req, now)

    def _issued_here(self, request_id: str) -> bool:
        return request_id.startswith(self.scheduler_id + "-")

    # -- results ----------------------------------------------------------------------------
    def on_work_done(self, peer: bytes, msg: WorkDone, now: float) -> None:
        # Acknowledged in the next message to this worker (its next assignment, else its next
        # heartbeat's ack), all sent after the commit: a result needs no message of its own.
        # A refused result is acknowledged too: the worker is not to send it again.
        self.work_acks.setdefault(peer, []).append(msg.call_id)
        upd = msg.update
        rid = msg.request_id
        w = self.workers.get(peer)
        if w is None:
            self._refuse_result(peer, msg, "the peer is not a registered worker")
            return
        served = w.busy
        if served is not None and served.request_id == rid:
            sub = served.submission
            self._set_idle(w)
            self.running.pop(rid, None)
            if (upd.job_id, upd.candidate_id, upd.stage) != (sub.job_id, sub.candidate_id, served.stage):
                self._refuse_result(peer, msg, f"its update is for {upd.job_id}/{upd.candidate_id} "
                                               f"{upd.stage}, not for the request's candidate")
                if not served.orphan and self._is_live(served):
                    self._requeue_lost(served, f"worker {w.name} answered it for another candidate", now)
                return
            w.completed += 1
            w.recent.append(rid)
            if not served.orphan:
                self.pools.record_service(served.pool, max(0.0, upd.finished_at - upd.started_at))
            if w.pending_pool:
                self._set_pool(w, w.pending_pool)
                self.counters["reassignments"] += 1
            if served.orphan:
                self._kept_result(w, msg, now)
            elif self._is_live(served):
                self._complete(served, upd, now)
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
            if not self._is_live(req):
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
                self._unqueue(req)
            del self.released[rid]
        else:
            # Assigned by an earlier scheduler, whose books are gone: the journal knows the key.
            req = self._find_live((upd.job_id, upd.candidate_id, upd.stage))
            if req is None:
                self.counters["duplicates_ignored"] += 1
                return
            if req.request_id and req.request_id in self.running:
                # Also running elsewhere (adopted after a restart): this result wins.
                self.running.pop(req.request_id)
                for other in self.workers.values():
                    if other.busy is req:
                        self.reply(other.peer, CancelWork(request_id=req.request_id))
            else:
                self._unqueue(req)
        self._complete(req, upd, now)

    def _refuse_result(self, peer: bytes, msg: WorkDone, why: str) -> None:
        self.counters["results_refused"] += 1
        known = self.peers.get(peer)
        upd = msg.update
        log.warning("refused a result from %s %r (peer %r) for request %r (%s/%s %s): %s",
                    known.role if known else "peer", known.name if known else "?", peer[:40],
                    msg.request_id, upd.job_id, upd.candidate_id, upd.stage, why)

    def _requeue_lost(self, req: QueuedRequest, reason: str, now: float) -> None:
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
                verdict=Verdict(stage=req.stage, error=(
                    f"evaluation lost its worker {req.attempts} times (setting max_request_attempts); "
                    f"last: {reason}")))
            self._complete(req, upd, now)
            return
        self.counters["requests_requeued"] += 1
        log.info("re-queued %s after %s", req.key, reason)
        self._push(req, now, count_arrival=False)
