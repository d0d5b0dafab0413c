"""The scheduler's logic, without sockets or processes: jobs, queues, workers, pools, journal.

The scheduler actor (scheduler.py) feeds every decoded message to `handle(peer, msg, now)`, calls
`tick(now)` on a timer and `schedule(now)` after each batch, commits the journal, then sends
`outbox` and carries out `actions` (start or stop a job's reasoner process). KV pools' reports
arrive through `on_kv_stats`; the resize requests they are due go out through `kv_outbox`
(runtime/kv_steward.py decides them). Tests drive this class directly with fake peer ids and a
clock of their own.

The core is composed of parts, each in its own module and holding its own state: the worker
registry (`registry`, worker_registry.py: peers, workers, liveness), the assignment policy
(`assigner`, assignment.py: queues, one-off requests, assignment, the pools' split, KV steering),
the job book (`book`, job_book.py: jobs, candidates, verdicts, events, journal records, with its
gate on who may act for a job in job_access.py), what clients read of jobs (`views`,
job_views.py) and the intake of results (`results`, results.py: which results are taken, lost
workers' requests). Each is handed at construction what it uses of the others; where a part built
earlier reaches one built later (the registry telling the job book that a reasoner registered), it
does so through a callback of the core. The core keeps the entry points, the dispatch by message
type, the outbox and actions, the counters and the stats.

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
- A job's requests (its candidates, cancel, subscription, status, resync) are taken from its
  owner, its reasoner and the admin only (runtime/ownership.py); anyone else gets ErrorReply
  "not_owner" and the job is left as it was. With CURVE, every message's key must be the one its
  peer registered with. Stats show other clients' job and candidate ids to the admin only.
"""
from __future__ import annotations

import collections
import itertools
import logging
import uuid
from typing import Callable

from specgen.clock import SYSTEM_CLOCK, Clock
from specgen.messages import (
    CancelJob, CreateJob, DeadNotice, ErrorReply, EvaluateRequest, GetJob, GetStats, Goodbye, Heartbeat,
    Hello, KvPoolResize, KvPoolStats, Ping, PoolStat, Pong, ReportJobEvent, ReportJobResult, ResyncUpdates,
    SchedulerStats, StatsReply, SubmitCandidate, SubscribeJob, WorkDone, WorkerExited, WorkerStat, _Wire,
)
from specgen.runtime.assignment import AssignmentPolicy
from specgen.runtime.job_book import JobBook, JobState, Key
from specgen.runtime.job_views import JobViews
from specgen.runtime.journal import Journal
from specgen.runtime.ownership import may_act_for
from specgen.runtime.pools import UsageMeter
from specgen.runtime.priority import POOLS, QueuedRequest
from specgen.runtime.results import ResultIntake
from specgen.runtime.settings import RuntimeSettings
from specgen.runtime.worker_registry import ROLES, Peer, WorkerRegistry, WorkerState

__all__ = ["ROLES", "JobState", "Key", "Peer", "SchedulerCore", "WorkerState"]

log = logging.getLogger(__name__)


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
        self.scheduler_id = scheduler_id or uuid.uuid4().hex[:12]
        self.clock = clock
        self.wall = wall if wall is not None else clock.wall
        now = clock.now() if now is None else now
        self.started = now
        self.outbox: list[tuple[bytes, _Wire]] = []
        self.actions: list[tuple[str, str]] = []       # ("start_reasoner" | "stop_reasoner", job_id)
        self.kv_outbox: list[tuple[bytes, KvPoolResize]] = []   # (pool identity, request)
        self.kv_endpoint = ""                                    # set by the actor once bound
        self.counters = collections.Counter()
        self.usage = UsageMeter(now)
        self.feedback_latencies: collections.deque[float] = collections.deque(maxlen=20_000)
        # Called with each feedback latency as it is recorded (the metrics' histogram).
        self.feedback_observer: Callable[[float], None] | None = None
        seq = itertools.count(1)                       # queue order, shared by every kind of request
        # Built in the order they lean on each other; the lambdas reach parts built later.
        self.registry = WorkerRegistry(
            settings, self.scheduler_id, join_secret, self.counters, self.reply,
            reasoner_start=self.reasoner_start,
            reasoner_joined=lambda peer, hello: self.book.reasoner_joined(peer, hello),
            place_worker=lambda now: self.assigner.place_worker(now),
            adopt=lambda worker, hello, now: self.results.adopt(worker, hello, now),
            peer_lost=self._peer_lost)
        self.assigner = AssignmentPolicy(
            settings, self.scheduler_id, self.wall, seq, self.counters, self.usage, self.reply, self.registry,
            job_running=lambda job_id: self.book.is_running(job_id),
            drop=lambda req, reason: self.book.drop(req, reason))
        a = self.assigner
        self.book = JobBook(
            settings, journal, clock, self.wall, seq, self.counters, self.reply,
            peers=self.registry.peers, workers=self.registry.workers, running=a.running, push=a.push,
            unqueue=a.unqueue, total_queued=a.total_queued, answer_direct=a.answer_direct,
            act=lambda action, job_id: self.actions.append((action, job_id)),
            on_feedback=self._record_feedback)
        self.views = JobViews(self.book.jobs, journal, self.book.access, self.reply)
        self.results = ResultIntake(
            settings, self.scheduler_id, self.wall, seq, self.counters, self.reply, self.registry,
            jobs=self.book.jobs, direct=a.direct, running=a.running, pools=a.pools, push=a.push,
            unqueue=a.unqueue, complete=self.book.complete)
        self.init_dispatch()
        self.book.resume()

    @property
    def workers(self) -> dict[bytes, WorkerState]:
        return self.registry.workers

    # -- setup --------------------------------------------------------------------------
    def init_dispatch(self) -> None:
        # message type -> (handler, roles allowed to send it)
        any_role = set(ROLES)
        reg, book, views = self.registry, self.book, self.views
        self.dispatch: dict[type, tuple[Callable[[bytes, _Wire, float], None], set[str]]] = {
            Heartbeat: (reg.on_heartbeat, any_role),
            Goodbye: (reg.on_goodbye, any_role),
            DeadNotice: (reg.on_dead_notice, any_role),
            Ping: (self.on_ping, any_role),
            GetStats: (self.on_get_stats, any_role),
            SubmitCandidate: (book.on_submit, {"client", "reasoner"}),
            EvaluateRequest: (self.assigner.on_evaluate, {"client", "reasoner"}),
            CancelJob: (book.on_cancel_job, {"client", "reasoner"}),
            CreateJob: (book.on_create_job, {"client"}),
            SubscribeJob: (views.on_subscribe, {"client", "reasoner"}),
            GetJob: (views.on_get_job, {"client", "reasoner"}),
            ResyncUpdates: (views.on_resync, {"client", "reasoner"}),
            ReportJobEvent: (book.on_report_event, {"reasoner"}),
            ReportJobResult: (book.on_report_result, {"reasoner"}),
            WorkDone: (self.results.on_work_done, {"worker"}),
            WorkerExited: (reg.on_worker_exited, {"node"}),
        }

    def _peer_lost(self, peer: bytes, known: Peer | None, w: WorkerState | None, reason: str,
                   now: float) -> None:
        """What a lost peer leaves behind, after the registry forgot it: the request its worker
        held goes back to its queue, its jobs lose it as reasoner, submitter and subscriber, and a
        lost caller's one-off requests are dropped (nobody will read the answer)."""
        if w is not None and w.busy is not None:
            self.results.release(w, reason, now)
        self.book.forget_peer(peer)
        if known is not None and known.role in ("client", "reasoner"):
            self.assigner.drop_calls_of(peer)

    def _record_feedback(self, latency: float) -> None:
        self.feedback_latencies.append(latency)
        if self.feedback_observer is not None:
            self.feedback_observer(latency)

    # -- entry points -----------------------------------------------------------------------
    def handle(self, peer: bytes, msg: _Wire, now: float, curve_key: str | None = None) -> None:
        """`curve_key`: the sender's CURVE public key, read from the message (None: CURVE is off)."""
        self.usage.advance(now)
        if type(msg) is Hello:
            self.registry.on_hello(peer, msg, now, curve_key)
            return
        known = self.registry.peers.get(peer)
        ref = getattr(msg, "call_id", 0)
        if known is None or known.curve_key != curve_key:
            # A different key behind a known routing id is another connection that took the id
            # over: it is not that peer, and registers as itself first.
            self.reply(peer, ErrorReply(
                code="unregistered", ref=ref,
                message="unknown peer (new or restarted scheduler, or timed out): send Hello first"))
            return
        self.registry.touch(known, now)
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
        self.registry.expire(now)
        self.book.expire(now)
        self.assigner.rebalance(now)
        self.assigner.kv.expire(now)

    def schedule(self, now: float) -> int:
        """Give queued requests to idle workers (the assignment policy's `schedule`), then queue
        the KV pools' resizes that go with it; returns how many were assigned."""
        assigned = self.assigner.schedule(now)
        self.kv_outbox.extend(self.assigner.steer_kv(now))
        return assigned

    def reasoner_start(self, job_id: str) -> int | None:
        """Which start of its reasoner job `job_id` is on (None: the scheduler has no such job)."""
        job = self.book.jobs.get(job_id)
        return job.attempts if job is not None else None

    def reasoner_exited(self, job_id: str, exit_code: int, detail: str, now: float) -> None:
        """The job's reasoner process exited (the actor saw it): started again, or the job fails."""
        self.book.reasoner_exited(job_id, exit_code, detail, now)

    # -- remote KV pools ----------------------------------------------------------------------
    def on_kv_stats(self, identity: bytes, stats: KvPoolStats, now: float) -> None:
        self.assigner.kv.on_stats(identity, stats, now)

    def kv_send_failed(self, identity: bytes) -> None:
        self.assigner.kv.send_failed(identity)

    # -- observability ----------------------------------------------------------------------
    def on_ping(self, peer: bytes, msg: Ping, now: float) -> None:
        self.reply(peer, Pong(call_id=msg.call_id, payload=msg.payload))

    def on_get_stats(self, peer: bytes, msg: GetStats, now: float) -> None:
        self.reply(peer, StatsReply(call_id=msg.call_id, stats=self.stats(now, self.registry.peers[peer])))

    def _shows(self, viewer: Peer | None, req: QueuedRequest) -> bool:
        """Whether the stats for `viewer` (None: the scheduler's own, e.g. its metrics) may name
        this request's job and candidate."""
        if viewer is None or viewer.admin:
            return True
        if req.direct:
            caller = self.registry.peers.get(req.reply_to) if req.reply_to is not None else None
            return caller is not None and caller.owner == viewer.owner
        job = self.book.jobs.get(req.key[0])
        return job is not None and may_act_for(viewer, job.spec.job_id, job.owner)

    def stats(self, now: float, viewer: Peer | None = None) -> SchedulerStats:
        """Everything, for `viewer` None (the scheduler's own use) or the admin; for any other
        peer, other clients' job and candidate ids and the workers' error texts are left out."""
        self.usage.advance(now)
        restricted = viewer is not None and not viewer.admin
        a, peers, jobs = self.assigner, self.registry.peers, self.book.jobs
        queued = a.queued()
        running = {p: 0 for p in POOLS}
        for req in a.running.values():
            running[req.pool] += 1
        pool_stats = {}
        for p in POOLS:
            est = a.pools.estimate(p, now, queued[p])
            pool_stats[p] = PoolStat(
                workers=self.registry.pool_size[p], queued=queued[p],
                running=running[p], arrival_rate=est.rate, service_s=est.service_s,
                offered_load=est.offered, utilization=self.usage.utilization(p))
        lat = sorted(self.feedback_latencies)
        pick = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]) if lat else (lambda q: None)
        return SchedulerStats(
            scheduler_id=self.scheduler_id, uptime_s=now - self.started,
            pool_mode=self.settings.pool_mode, priority_rule=a.rule.criteria,
            validate=pool_stats["validate"], profile=pool_stats["profile"],
            workers=[WorkerStat(
                name=w.name, node=w.node, device=w.device, pool=w.pool,
                busy_stage=w.busy.stage if w.busy else "",
                busy_for_s=(now - w.busy_since) if w.busy else 0.0, completed=w.completed,
                pending_pool=w.pending_pool or "", pid=w.pid, host=w.host, sandbox=w.sandbox,
                busy_candidate=f"{w.busy.key[0]}/{w.busy.key[1]}"
                if w.busy and self._shows(viewer, w.busy) else "")
                for w in self.workers.values()],
            nodes=sorted(p.name for p in peers.values() if p.role == "node"),
            # A worker's error is the tail of its log, which can quote a candidate's output.
            node_health={p.name: ({name: {k: v for k, v in h.items() if k != "error"}
                                   if isinstance(h, dict) else h for name, h in p.health.items()}
                                  if restricted else p.health)
                         for p in peers.values() if p.role == "node" and p.health},
            jobs_running=sum(1 for j in jobs.values() if j.state == "running"),
            jobs_by_state={**({"running": n} if (n := sum(1 for j in jobs.values()
                                                          if j.state == "running")) else {}),
                           **self.book.jobs_finished},
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
            kv_control_endpoint=self.kv_endpoint, kv_pools=a.kv.views(now),
            jobs=sorted(job_id for job_id, j in jobs.items() if j.state == "running"
                        and (viewer is None or may_act_for(viewer, job_id, j.owner))),
            restricted=restricted,
            requests_not_owner=self.counters["requests_not_owner"],
        )
