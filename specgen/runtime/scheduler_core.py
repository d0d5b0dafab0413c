"""The scheduler's logic, without sockets or processes: jobs, queues, workers, pools, journal.

The scheduler actor (scheduler.py) feeds every decoded message to `handle(peer, msg, now)`, calls
`tick(now)` on a timer and `schedule(now)` after each batch, commits the journal, then sends
`outbox` and carries out `actions` (start or stop a job's reasoner process). KV pools' reports
arrive through `on_kv_stats`; the resize requests they are due go out through `kv_outbox`
(runtime/kv_steward.py decides them). Tests drive this class directly with fake peer ids and a
clock of their own.

Time comes from the caller's `now` arguments and, where the core needs it on its own (start-up,
resume, wall timestamps of verdicts it makes up), from its injected `clock` (specgen/clock.py):
a `VirtualClock` makes a run of the core exactly repeatable and free of real time.

Invariants:
- A stage request is identified by its key (job_id, candidate_id, stage). At most one result per
  key is recorded and forwarded: later results for the same key are counted and ignored.
- A request leaves the books only with a recorded result or a drop (its job ended, its deadline
  passed, or it lost `max_request_attempts` workers). A lost worker's request goes back to its
  queue with its original priority.
- A worker changes pool only while idle; a busy worker is marked and moves when it reports.
- A result is accepted only from the worker that holds the request: its current assignment (or
  the request it said it was running when it registered), or a result it kept from before it
  registered again (listed in its Hello: from a previous scheduler, or of a request taken back
  from it that nobody else took since). Any other result is refused, logged and counted
  (`results_refused`), and acknowledged so the worker does not send it again.
- With a join secret (the scheduler process always has one), a worker, node or reasoner
  registers only with the credential derived from it (runtime/auth.py); clients need none.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
import uuid
from dataclasses import dataclass, field
from typing import Callable

import msgspec

from specgen.clock import SYSTEM_CLOCK, Clock
from specgen.messages import (
    PROTOCOL_VERSION, Ack, AssignWork, CancelJob, CancelWork, CandidateSubmission,
    CandidateUpdate, CandidateUpdateNotice, CreateJob, DeadNotice, ErrorReply, EvaluateQueued,
    EvaluateReply, EvaluateRequest, GetJob, GetStats, Goodbye, Heartbeat, HeartbeatAck, Hello, JobCreated,
    JobEvent, JobEventNotice, JobResult, JobSpec, JobStatus, JobStatusReply, KvPoolResize, KvPoolStats,
    Ping, PoolStat, Pong,
    ReportJobEvent, ReportJobResult, ResyncUpdates, SchedulerStats, StatsReply, SubmitAck,
    SubmitCandidate, SubscribeJob, Verdict, Welcome, WorkDone, WorkerExited, WorkerStat, _Wire,
)
from specgen.runtime.auth import AUTHENTICATED_ROLES, check_credential
from specgen.runtime.journal import Journal
from specgen.runtime.kv_steward import KvPoolSteward, WorkerPlacement, device_index
from specgen.runtime.pools import PoolController, UsageMeter
from specgen.runtime.priority import POOLS, PriorityRule, QueuedRequest, RequestQueue
from specgen.runtime.settings import RuntimeSettings

log = logging.getLogger(__name__)

ROLES = ("client", "worker", "node", "reasoner")
Key = tuple[str, str, str]
_MAX_HELD_RESULTS = 256          # kept results a worker may list in its Hello
_MAX_RELEASED = 1024             # requests taken back from lost workers, remembered for their results
_RECENT_RESULTS = 16             # request ids a worker answered lately (a repeat is a duplicate)
_MIN_PROGRESS_INTERVAL_S = 0.1   # EvaluateQueued notices to one caller about one request, at most this often


@dataclass(slots=True)
class Peer:
    id: bytes
    role: str
    name: str
    last_seen: float
    health: dict = field(default_factory=dict)


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


@dataclass
class JobState:
    spec: JobSpec
    has_reasoner: bool
    attempts: int = 0
    state: str = "running"
    submitter: bytes | None = None           # receives CandidateUpdates (reasoner or backend)
    reasoner_peer: bytes | None = None
    reasoner_started: float = 0.0             # monotonic; 0 = not started by us
    subscribers: set[bytes] = field(default_factory=set)
    candidates: dict[str, CandidateSubmission] = field(default_factory=dict)
    updates: dict[tuple[str, str], CandidateUpdate] = field(default_factory=dict)
    live: dict[Key, QueuedRequest] = field(default_factory=dict)   # queued or running
    last_seq: int = 0
    result: JobResult | None = None


def _best(updates: dict[tuple[str, str], CandidateUpdate]) -> tuple[str | None, Verdict | None]:
    best_id, best = None, None
    for (cid, stage), upd in updates.items():
        v = upd.verdict
        if stage == "validate" or not v.correct or v.speedup is None:
            continue
        if best is None or v.speedup > (best.speedup or 0.0):
            best_id, best = cid, v
    return best_id, best


class SchedulerCore:
    def __init__(
        self,
        settings: RuntimeSettings,
        journal: Journal,
        scheduler_id: str | None = None,
        wall: Callable[[], float] | None = None,
        now: float | None = None,
        join_secret: bytes | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """`join_secret`: workers, nodes and reasoners must present credentials derived from it
        (runtime/auth.py). None admits them without (tests and benchmarks that drive the core
        directly); the scheduler process always passes one. `clock` is where the core reads the
        time when no `now` is handed to it; `wall` (default: the clock's) stamps the verdicts
        and events the core makes up itself."""
        self.settings = settings
        self.journal = journal
        self.join_secret = join_secret
        self.scheduler_id = scheduler_id or uuid.uuid4().hex[:12]
        self.clock = clock
        self.wall = wall if wall is not None else clock.wall
        now = clock.now() if now is None else now
        self.init_state(now)
        self.init_pools(now)
        self.init_dispatch()
        self.resume()

    # -- setup --------------------------------------------------------------------------
    def init_state(self, now: float) -> None:
        self.started = now
        self.outbox: list[tuple[bytes, _Wire]] = []
        self.actions: list[tuple[str, str]] = []       # ("start_reasoner" | "stop_reasoner", job_id)
        self.peers: dict[bytes, Peer] = {}
        self.workers: dict[bytes, WorkerState] = {}
        self.jobs: dict[str, JobState] = {}
        self.running: dict[str, QueuedRequest] = {}    # request_id -> request
        self.direct: dict[Key, QueuedRequest] = {}     # one-off requests, queued or running
        self.progress_due: list[tuple[float, int, bool, Key]] = []   # (when, seq, first, key): _report_progress
        self.work_acks: dict[bytes, list[int]] = {}     # worker -> WorkDone call_ids not yet acked
        # request id -> (worker name, request) for requests taken back from lost workers: that
        # worker's kept result is still accepted while the request waits in its queue.
        self.released: collections.OrderedDict[str, tuple[str, QueuedRequest]] = collections.OrderedDict()
        self._refusals_logged: dict[str, float] = {}     # peer name -> last refused-Hello warning
        self.seq = itertools.count(1)
        self.request_ids = itertools.count(1)
        self.feedback_latencies: collections.deque[float] = collections.deque(maxlen=20_000)
        self.jobs_finished: collections.Counter[str] = collections.Counter()   # by result status
        # Called with each feedback latency as it is recorded (the metrics' histogram).
        self.feedback_observer: Callable[[float], None] | None = None
        self.counters = collections.Counter()

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

    def init_dispatch(self) -> None:
        # message type -> (handler, roles allowed to send it)
        any_role = set(ROLES)
        self.dispatch: dict[type, tuple[Callable[[bytes, _Wire, float], None], set[str]]] = {
            Heartbeat: (self.on_heartbeat, any_role),
            Goodbye: (self.on_goodbye, any_role),
            DeadNotice: (self.on_dead_notice, any_role),
            Ping: (self.on_ping, any_role),
            GetStats: (self.on_get_stats, any_role),
            SubmitCandidate: (self.on_submit, {"client", "reasoner"}),
            EvaluateRequest: (self.on_evaluate, {"client", "reasoner"}),
            CancelJob: (self.on_cancel_job, {"client", "reasoner"}),
            CreateJob: (self.on_create_job, {"client"}),
            SubscribeJob: (self.on_subscribe, {"client", "reasoner"}),
            GetJob: (self.on_get_job, {"client", "reasoner"}),
            ResyncUpdates: (self.on_resync, {"client", "reasoner"}),
            ReportJobEvent: (self.on_report_event, {"reasoner"}),
            ReportJobResult: (self.on_report_result, {"reasoner"}),
            WorkDone: (self.on_work_done, {"worker"}),
            WorkerExited: (self.on_worker_exited, {"node"}),
        }

    def resume(self) -> None:
        """Rebuild running jobs from the journal: re-queue every stage that has no verdict yet."""
        for rec in self.journal.unfinished_jobs():
            job = JobState(spec=rec.spec, has_reasoner=rec.has_reasoner, attempts=rec.attempts,
                           last_seq=rec.last_seq)
            self.jobs[rec.spec.job_id] = job
            for upd in rec.updates:
                job.updates[(upd.candidate_id, upd.stage)] = upd
            for sub in rec.candidates:
                job.candidates[sub.candidate_id] = sub
                stage = self._next_stage(job, sub)
                if stage is not None:
                    self._enqueue_job_request(job, sub, stage, count_arrival=False)
            self.counters["jobs_resumed"] += 1
            self._emit(job, "resumed", {"candidates": len(job.candidates), "updates": len(job.updates)})
            if job.has_reasoner:
                self._start_reasoner(job, self.clock.now())
            log.info("resumed job %s: %d candidates, %d verdicts", job.spec.job_id,
                     len(job.candidates), len(job.updates))

    # -- entry points -----------------------------------------------------------------------
    def handle(self, peer: bytes, msg: _Wire, now: float) -> None:
        self.usage.advance(now)
        if type(msg) is Hello:
            self.on_hello(peer, msg, now)
            return
        known = self.peers.get(peer)
        ref = getattr(msg, "call_id", 0)
        if known is None:
            self.reply(peer, ErrorReply(
                code="unregistered", ref=ref,
                message="unknown peer (new or restarted scheduler, or timed out): send Hello first"))
            return
        known.last_seen = now
        entry = self.dispatch.get(type(msg))
        if entry is None or known.role not in entry[1]:
            self.reply(peer, ErrorReply(
                code="unexpected", ref=ref,
                message=f"a {known.role} cannot send {type(msg).__name__} to the scheduler"))
            return
        entry[0](peer, msg, now)

    def reply(self, peer: bytes, msg: _Wire) -> None:
        self.outbox.append((peer, msg))

    def tick(self, now: float) -> None:
        self.usage.advance(now)
        timeout = self.settings.peer_timeout_s
        for peer in [p for p in self.peers.values() if now - p.last_seen > timeout]:
            self._peer_lost(peer.id, f"silent for more than {timeout:g} s (setting peer_timeout_s)", now)
        wall = self.wall()
        for job in list(self.jobs.values()):
            if job.state != "running":
                continue
            if (job.has_reasoner and job.reasoner_peer is None and job.reasoner_started
                    and now - job.reasoner_started > self.settings.ready_timeout_s):
                self._finish_job(job, JobResult(
                    job_id=job.spec.job_id, status="failed",
                    error=f"the job's reasoner did not register within "
                          f"{self.settings.ready_timeout_s:g} s (setting ready_timeout_s)"), now)
            elif job.spec.deadline is not None and wall > job.spec.deadline + self.settings.job_grace_s:
                self._finish_job(job, JobResult(
                    job_id=job.spec.job_id, status="timed_out",
                    error=f"wall time of {job.spec.wall_time_s:g} s used up and the reasoner did not "
                          f"finish within {self.settings.job_grace_s:g} s more (setting job_grace_s)"), now)
        self.rebalance(now)
        self.kv.expire(now)

    # -- peers ------------------------------------------------------------------------------
    def on_hello(self, peer: bytes, msg: Hello, now: float) -> None:
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
        known = self.peers.get(peer)
        if known is not None and (known.role, known.name) != (msg.role, msg.name):
            # The same connection registering as someone else: it starts over as that one
            # (a client's connection never keeps a client's registration while acting as a worker).
            self._peer_lost(peer, f"registered again as {msg.role} {msg.name}", now)
            known = None
        if known is None:
            # Another live peer with the same worker name is an older incarnation: it is gone.
            if msg.role == "worker":
                for other in [w for w in self.workers.values() if w.name == msg.name]:
                    self._peer_lost(other.peer, "replaced by a new process of the same name", now)
            known = Peer(id=peer, role=msg.role, name=msg.name, last_seen=now)
            self.peers[peer] = known
            log.info("%s %s joined", msg.role, msg.name)
        known.last_seen = now
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
        ))

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
        w = self.workers.pop(peer, None)
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
        self.workers[peer] = w
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
            w.busy, w.busy_since = req, now

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

    def _issued_here(self, request_id: str) -> bool:
        return request_id.startswith(self.scheduler_id + "-")

    def _unqueue(self, req: QueuedRequest) -> None:
        self.queues[req.pool].remove(req)

    def _push(self, req: QueuedRequest, now: float, count_arrival: bool = True) -> None:
        req.enqueued_at = now
        self.queues[req.pool].push(req)
        if count_arrival:
            self.pools.record_arrival(req.pool, now)

    def _next_stage(self, job: JobState, sub: CandidateSubmission) -> str | None:
        validated = job.updates.get((sub.candidate_id, "validate"))
        if validated is None:
            return "validate"
        if (validated.verdict.correct and sub.profile and not validated.cancelled
                and (sub.candidate_id, "profile") not in job.updates):
            return "profile"
        return None

    def _enqueue_job_request(self, job: JobState, sub: CandidateSubmission, stage: str,
                             count_arrival: bool = True, now: float | None = None) -> None:
        deadline = min(sub.deadline or math.inf, job.spec.deadline or math.inf)
        key = (job.spec.job_id, sub.candidate_id, stage)
        req = QueuedRequest(key=key, stage=stage, submission=sub, seq=next(self.seq), deadline=deadline)
        job.live[key] = req
        self._push(req, self.clock.now() if now is None else now, count_arrival)

    def on_submit(self, peer: bytes, msg: SubmitCandidate, now: float) -> None:
        sub = msg.submission
        if not sub.job_id or not sub.candidate_id:
            self.reply(peer, ErrorReply(code="bad_request", ref=msg.call_id, message=(
                "submission needs a job_id and a candidate_id (use EvaluateRequest for a one-off candidate)")))
            return
        job = self.jobs.get(sub.job_id)
        if job is None:
            rec = self.journal.job(sub.job_id)
            if rec is not None:
                self.reply(peer, SubmitAck(call_id=msg.call_id, accepted=False,
                                           reason=f"job {sub.job_id} has ended ({rec.result.status if rec.result else rec.state})"))
                return
            # A job the submitter runs itself (no reasoner here), e.g. an optimize loop in its own process.
            spec = JobSpec(job_id=sub.job_id, problem_name=sub.problem_name, created_at=self.wall())
            job = JobState(spec=spec, has_reasoner=False)
            self.jobs[sub.job_id] = job
            self.journal.put_job(spec, "running", False, 0)
        if job.submitter != peer:
            job.submitter = peer
        if sub.candidate_id in job.candidates:
            # Known (a resumed reasoner submits again): nothing is queued twice; replay its verdicts.
            for (cid, _stage), upd in job.updates.items():
                if cid == sub.candidate_id:
                    self.reply(peer, CandidateUpdateNotice(update=upd))
            self.reply(peer, SubmitAck(call_id=msg.call_id, duplicate=True))
            return
        if self._total_queued() >= self.settings.max_queued_requests:
            self.counters["refused_busy"] += 1
            self.reply(peer, SubmitAck(call_id=msg.call_id, accepted=False, reason=(
                f"busy: {self._total_queued()} requests queued (setting max_queued_requests)")))
            return
        job.candidates[sub.candidate_id] = sub
        self.journal.put_candidate(sub)
        self._enqueue_job_request(job, sub, "validate", now=now)
        self.reply(peer, SubmitAck(call_id=msg.call_id))

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
            w.busy = None
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
                w.pool, w.pending_pool = w.pending_pool, None
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

    def _complete(self, req: QueuedRequest, upd: CandidateUpdate, now: float) -> None:
        self.counters["requests_done"] += 1
        if req.direct:
            self.direct.pop(req.key, None)
            if req.reply_to is not None:
                self.reply(req.reply_to, EvaluateReply(call_id=req.call_id, update=upd))
            return
        job = self.jobs.get(req.key[0])
        if job is None or job.state != "running":
            return
        job.live.pop(req.key, None)
        if (req.key[1], req.key[2]) in job.updates:
            self.counters["duplicates_ignored"] += 1
            return
        self._record_update(job, upd)
        sub = req.submission
        if upd.stage in ("profile", "full") and sub.extracted_at > 0 and not upd.cancelled:
            latency = max(0.0, upd.finished_at - sub.extracted_at)
            self.feedback_latencies.append(latency)
            if self.feedback_observer is not None:
                self.feedback_observer(latency)
        if upd.stage == "validate" and not upd.cancelled:
            if self._next_stage(job, sub) == "profile":
                self._enqueue_job_request(job, sub, "profile", now=now)

    def _record_update(self, job: JobState, upd: CandidateUpdate) -> None:
        job.updates[(upd.candidate_id, upd.stage)] = upd
        self.journal.put_update(upd)
        if job.submitter is not None:
            self.reply(job.submitter, CandidateUpdateNotice(update=upd))
        v = upd.verdict
        self._emit(job, "verdict", {
            "candidate_id": upd.candidate_id, "stage": upd.stage, "correct": v.correct,
            "compiled": v.compiled, "speedup": v.speedup, "worker": upd.worker,
            "cancelled": upd.cancelled, "error": (v.error or "")[:500] or None,
        })

    def _drop(self, req: QueuedRequest, reason: str) -> None:
        """Answer a request that will never run (cancelled update / reply)."""
        self.counters["requests_dropped"] += 1
        upd = CandidateUpdate(
            job_id=req.key[0], candidate_id=req.submission.candidate_id if req.direct else req.key[1],
            stage=req.stage, verdict=Verdict(stage=req.stage, error=f"cancelled: {reason}"),
            finished_at=self.wall(), cancelled=True)
        if req.direct:
            self.direct.pop(req.key, None)
            if req.reply_to is not None:
                self.reply(req.reply_to, EvaluateReply(call_id=req.call_id, update=upd))
            return
        job = self.jobs.get(req.key[0])
        if job is None:
            return
        job.live.pop(req.key, None)
        if job.state == "running":
            self._record_update(job, upd)
        elif job.submitter is not None:
            self.reply(job.submitter, CandidateUpdateNotice(update=upd))

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

    # -- assignment and pools ---------------------------------------------------------------
    def schedule(self, now: float) -> int:
        """Give queued requests to idle workers; returns how many were assigned.

        A worker takes the best head (by the priority rule) of its own pool's queue and, when
        lending, of the other pool's queue, but only while no worker of that other pool is idle
        to take it itself.
        """
        assigned = 0
        idle = [w for w in self.workers.values() if w.busy is None]
        if idle and self._total_queued():
            wall = self.wall()
            idle_in = dict.fromkeys(POOLS, 0)
            for w in idle:
                idle_in[w.pool] += 1
            progress = True
            while progress and self._total_queued():
                progress = False
                for w in idle:
                    if w.busy is not None:
                        continue
                    other = "profile" if w.pool == "validate" else "validate"
                    req = self._pick(w, wall, lend=self.lending and idle_in[other] == 0)
                    if req is None:
                        continue
                    self._assign(w, req, now, wall)
                    idle_in[w.pool] -= 1
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
        w.busy, w.busy_since = req, now
        self.running[req.request_id] = req
        self.reply(w.peer, AssignWork(request_id=req.request_id, stage=req.stage, submission=req.submission,
                                      acked=self.work_acks.pop(w.peer, [])))

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
        placements = [WorkerPlacement(name=w.name, host=w.host, device=device_index(w.device),
                                      busy=w.busy is not None) for w in self.workers.values()]
        self.kv_outbox.extend(self.kv.steer(placements, now))

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
                w.pool, w.pending_pool = dst, None
                self.counters["reassignments"] += 1
            else:
                w.pending_pool = dst if dst != w.pool else None
            self.pools.last_move = now
            log.info("pool change: %s %s -> %s%s", w.name, src, dst, "" if w.busy is None else " (after its request)")

    def _refresh_usage(self) -> None:
        u = self.usage
        for p in POOLS:
            u.workers[p] = 0
            u.busy_now[p] = 0
        for w in self.workers.values():
            u.workers[w.pool] += 1
            if w.busy is not None:
                u.busy_now[w.pool] += 1
        u.queued_now = self._total_queued()

    # -- jobs -------------------------------------------------------------------------------
    def _emit(self, job: JobState, kind: str, data: dict, t: float | None = None) -> JobEvent:
        job.last_seq += 1
        event = JobEvent(job_id=job.spec.job_id, seq=job.last_seq, kind=kind, t=t or self.wall(), data=data)
        self.journal.put_event(event)
        for sub in job.subscribers:
            self.reply(sub, JobEventNotice(event=event))
        return event

    def _start_reasoner(self, job: JobState, now: float) -> None:
        job.attempts += 1
        job.reasoner_peer = None
        job.reasoner_started = now
        self.journal.put_job(job.spec, "running", True, job.attempts)
        self.actions.append(("start_reasoner", job.spec.job_id))

    def on_create_job(self, peer: bytes, msg: CreateJob, now: float) -> None:
        spec = msg.spec
        if not spec.job_id:
            spec.job_id = f"job-{uuid.uuid4().hex[:12]}"
        if spec.job_id in self.jobs or self.journal.job(spec.job_id) is not None:
            self.reply(peer, JobCreated(call_id=msg.call_id, job_id=spec.job_id))   # idempotent
            return
        if not spec.problem_source.strip():
            self.reply(peer, ErrorReply(code="bad_request", ref=msg.call_id,
                                        message="JobSpec.problem_source is empty: pass the problem's program"))
            return
        spec.entry = spec.entry or self.settings.default_job_entry
        if ":" not in spec.entry:
            self.reply(peer, ErrorReply(code="bad_request", ref=msg.call_id, message=(
                f"JobSpec.entry {spec.entry!r} must be 'module:function'")))
            return
        if spec.entry not in self.settings.job_entries and spec.entry != self.settings.default_job_entry:
            self.counters["jobs_refused"] += 1
            self.reply(peer, ErrorReply(code="bad_request", ref=msg.call_id, message=(
                f"JobSpec.entry {spec.entry!r} is not one this scheduler runs "
                f"({', '.join(self.settings.job_entries)}); add it to the setting job_entries")))
            return
        spec.created_at = self.wall()
        if spec.wall_time_s is not None:
            spec.deadline = spec.created_at + spec.wall_time_s
        job = JobState(spec=spec, has_reasoner=True)
        self.jobs[spec.job_id] = job
        job.subscribers.add(peer)
        self._emit(job, "created", {"problem_name": spec.problem_name, "entry": spec.entry})
        self._start_reasoner(job, now)
        self.reply(peer, JobCreated(call_id=msg.call_id, job_id=spec.job_id))

    def on_cancel_job(self, peer: bytes, msg: CancelJob, now: float) -> None:
        job = self.jobs.get(msg.job_id)
        if job is None:
            if self.journal.job(msg.job_id) is None:
                self.reply(peer, ErrorReply(code="unknown_job", ref=msg.call_id, message=f"no job {msg.job_id!r}"))
            else:
                self.reply(peer, Ack(call_id=msg.call_id))
            return
        if job.has_reasoner and self.peers[peer].role != "reasoner":
            dropped = self._finish_job(job, JobResult(job_id=job.spec.job_id, status="cancelled",
                                                      error="cancelled on request"), now)
        else:
            # The job's own loop is done with its evaluations (e.g. it reached its target):
            # drop them, but the job stays open until its loop reports a result.
            dropped = self._drop_job_work(job, f"job {job.spec.job_id} no longer wants it")
        self.reply(peer, Ack(call_id=msg.call_id, count=dropped))

    def _finish_job(self, job: JobState, result: JobResult, now: float) -> int:
        """End a job: drop its queued work, stop its running work and reasoner. Returns drops."""
        if job.state != "running":
            return 0
        # Dropped work is recorded (and shown to subscribers) while the job is still running.
        dropped = self._drop_job_work(job, f"job {job.spec.job_id} ended ({result.status})")
        job.live.clear()
        job.state = "finished"
        if result.best_verdict is None:
            result.best_candidate_id, result.best_verdict = _best(job.updates)
        result.finished_at = result.finished_at or self.wall()
        job.result = result
        self.journal.put_job(job.spec, "finished", job.has_reasoner, job.attempts, result)
        self._emit(job, "finished", msgspec.to_builtins(result))
        if job.has_reasoner:
            self.actions.append(("stop_reasoner", job.spec.job_id))
        self.jobs_finished[result.status] += 1
        del self.jobs[job.spec.job_id]
        return dropped

    def _drop_job_work(self, job: JobState, reason: str) -> int:
        """Drop the job's queued requests and stop its running ones (each gets a cancelled update
        now; a stopped request's own late answer is then ignored). Returns how many."""
        dropped = 0
        for req in list(job.live.values()):
            if req.request_id and req.request_id in self.running:
                for w in self.workers.values():
                    if w.busy is req:
                        self.reply(w.peer, CancelWork(request_id=req.request_id))
            else:
                self._unqueue(req)
            self._drop(req, reason)
            dropped += 1
        return dropped

    def on_subscribe(self, peer: bytes, msg: SubscribeJob, now: float) -> None:
        job = self.jobs.get(msg.job_id)
        if job is None and self.journal.job(msg.job_id) is None:
            self.reply(peer, ErrorReply(code="unknown_job", ref=msg.call_id, message=f"no job {msg.job_id!r}"))
            return
        for event in self.journal.events_after(msg.job_id, msg.after_seq):
            self.reply(peer, JobEventNotice(event=event))
        if job is not None:
            job.subscribers.add(peer)
        self.reply(peer, Ack(call_id=msg.call_id))

    def job_status(self, job_id: str) -> JobStatus | None:
        job = self.jobs.get(job_id)
        if job is not None:
            return JobStatus(spec=job.spec, state=job.state, attempts=job.attempts,
                             candidates=len(job.candidates), updates=len(job.updates),
                             last_event_seq=job.last_seq, result=job.result)
        rec = self.journal.job(job_id)
        if rec is None:
            return None
        cands, upds = self.journal.counts(job_id)
        return JobStatus(spec=rec.spec, state=rec.state, attempts=rec.attempts, candidates=cands,
                         updates=upds, last_event_seq=rec.last_seq, result=rec.result)

    def on_get_job(self, peer: bytes, msg: GetJob, now: float) -> None:
        status = self.job_status(msg.job_id)
        if status is None:
            self.reply(peer, ErrorReply(code="unknown_job", ref=msg.call_id, message=f"no job {msg.job_id!r}"))
        else:
            self.reply(peer, JobStatusReply(call_id=msg.call_id, status=status))

    def on_report_event(self, peer: bytes, msg: ReportJobEvent, now: float) -> None:
        job = self.jobs.get(msg.event.job_id)
        if job is None or job.reasoner_peer != peer:
            return   # a late event from a reasoner whose job ended
        self._emit(job, msg.event.kind, msg.event.data, msg.event.t or None)

    def on_report_result(self, peer: bytes, msg: ReportJobResult, now: float) -> None:
        job = self.jobs.get(msg.result.job_id)
        if job is not None and job.reasoner_peer == peer:
            self._finish_job(job, msg.result, now)
        self.reply(peer, Ack(call_id=msg.call_id))

    def reasoner_exited(self, job_id: str, exit_code: int, detail: str, now: float) -> None:
        job = self.jobs.get(job_id)
        if job is None or job.state != "running":
            return
        self._finish_job(job, JobResult(
            job_id=job_id, status="failed",
            error=f"the job's reasoner exited with code {exit_code} before reporting a result"
                  + (f": {detail}" if detail else "")), now)

    def on_resync(self, peer: bytes, msg: ResyncUpdates, now: float) -> None:
        for job_id in msg.job_ids:
            job = self.jobs.get(job_id)
            updates = list(job.updates.values()) if job is not None else self.journal.updates_of(job_id)
            if job is not None:
                job.submitter = peer
            for upd in updates:
                self.reply(peer, CandidateUpdateNotice(update=upd))
        self.reply(peer, Ack(call_id=msg.call_id))

    # -- observability ----------------------------------------------------------------------
    def on_ping(self, peer: bytes, msg: Ping, now: float) -> None:
        self.reply(peer, Pong(call_id=msg.call_id, payload=msg.payload))

    def on_get_stats(self, peer: bytes, msg: GetStats, now: float) -> None:
        self.reply(peer, StatsReply(call_id=msg.call_id, stats=self.stats(now)))

    def stats(self, now: float) -> SchedulerStats:
        self.usage.advance(now)
        queued = self._queued()
        running = {p: 0 for p in POOLS}
        for req in self.running.values():
            running[req.pool] += 1
        pool_stats = {}
        for p in POOLS:
            est = self.pools.estimate(p, now, queued[p])
            pool_stats[p] = PoolStat(
                workers=sum(1 for w in self.workers.values() if w.pool == p), queued=queued[p],
                running=running[p], arrival_rate=est.rate, service_s=est.service_s,
                offered_load=est.offered, utilization=self.usage.utilization(p))
        lat = sorted(self.feedback_latencies)
        pick = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]) if lat else (lambda q: None)
        return SchedulerStats(
            scheduler_id=self.scheduler_id, uptime_s=now - self.started,
            pool_mode=self.settings.pool_mode, priority_rule=self.rule.criteria,
            validate=pool_stats["validate"], profile=pool_stats["profile"],
            workers=[WorkerStat(
                name=w.name, node=w.node, device=w.device, pool=w.pool,
                busy_stage=w.busy.stage if w.busy else "",
                busy_for_s=(now - w.busy_since) if w.busy else 0.0, completed=w.completed,
                pending_pool=w.pending_pool or "", pid=w.pid, host=w.host, sandbox=w.sandbox,
                busy_candidate=f"{w.busy.key[0]}/{w.busy.key[1]}" if w.busy else "")
                for w in self.workers.values()],
            nodes=sorted(p.name for p in self.peers.values() if p.role == "node"),
            node_health={p.name: p.health for p in self.peers.values() if p.role == "node" and p.health},
            jobs_running=sum(1 for j in self.jobs.values() if j.state == "running"),
            jobs_by_state={**({"running": n} if (n := sum(1 for j in self.jobs.values()
                                                          if j.state == "running")) else {}),
                           **self.jobs_finished},
            requests_done=self.counters["requests_done"],
            requests_requeued=self.counters["requests_requeued"],
            requests_dropped=self.counters["requests_dropped"],
            duplicates_ignored=self.counters["duplicates_ignored"],
            results_refused=self.counters["results_refused"],
            hellos_refused=self.counters["hellos_refused"],
            reassignments=self.counters["reassignments"],
            feedback_latency_p50_s=pick(0.5), feedback_latency_p95_s=pick(0.95),
            busy_while_waiting=self.usage.busy_share_while_waiting(),
            waiting_s=self.usage.waiting_time,
            kv_control_endpoint=self.kv_endpoint, kv_pools=self.kv.views(now),
        )
