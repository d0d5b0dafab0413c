"""The scheduler core's peers and workers: who is registered, who is alive, which request each
worker holds.

A part of `SchedulerCore` (scheduler_core.py). It owns `peers`, `workers`, the results' acks not
yet sent (`work_acks`), and an index of the workers kept up to date as they change (`idle` per
pool, `pool_size`, `workers_version`), so that a scheduling decision costs the same with 8 workers
or 500: a worker's `busy` and `pool` change only through `set_busy`, `set_idle` and `set_pool`.
What a registration or a loss means beyond the peer itself (a reasoner's job, a new worker's pool
and the request it says it runs, a lost worker's request, a lost caller's one-off requests) is left
to the callbacks the core passes in, which reach the parts that own those.
"""
from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field
from typing import Callable, get_args

from specgen.messages import (
    PROTOCOL_VERSION, DeadNotice, ErrorReply, Goodbye, Heartbeat, HeartbeatAck, Hello, PeerRole, Pool,
    Welcome,
    WorkerExited, _Wire,
)
from specgen.runtime.auth import ADMIN_ROLE, AUTHENTICATED_ROLES, check_credential, reasoner_start_of
from specgen.runtime.ownership import MIN_TOKEN_CHARS, identity_of
from specgen.runtime.priority import POOLS, QueuedRequest
from specgen.runtime.settings import RuntimeSettings

log = logging.getLogger("specgen.runtime.scheduler_core")   # one logger for the whole core

# Hello.role's values: a Hello off the wire with another is refused when decoded; the check against
# ROLES is for messages handed to the core undecoded (the in-process cluster, the simulator).
ROLES: tuple[PeerRole, ...] = get_args(PeerRole)
_MAX_HELD_RESULTS = 256          # kept results a worker may list in its Hello
_RECENT_RESULTS = 16             # request ids a worker answered lately (a repeat is a duplicate)


@dataclass(slots=True)
class Peer:
    id: bytes
    role: PeerRole
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
    pool: Pool
    busy: QueuedRequest | None = None
    busy_since: float = 0.0
    completed: int = 0
    pending_pool: Pool | None = None
    pid: int = 0
    host: str = ""
    sandbox: str = ""                               # how its candidates run (Hello.sandbox)
    held: set[str] = field(default_factory=set)     # kept results it listed in its Hello
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=_RECENT_RESULTS))

    @property
    def future_pool(self) -> Pool:
        return self.pending_pool or self.pool


class WorkerRegistry:
    """Peers, workers and their liveness."""

    def __init__(
        self,
        settings: RuntimeSettings,
        scheduler_id: str,
        join_secret: bytes | None,
        counters: collections.Counter,
        reply: Callable[[bytes, _Wire], None],
        *,
        reasoner_start: Callable[[str], int | None],
        reasoner_joined: Callable[[bytes, Hello], None],
        place_worker: Callable[[float], str],
        adopt: Callable[[WorkerState, Hello, float], None],
        peer_lost: Callable[[bytes, Peer | None, WorkerState | None, str, float], None],
    ) -> None:
        """`reasoner_start(job_id)`: which start of its reasoner the job is on (a reasoner registers
        for the latest start of a job the scheduler has), None when there is no such job;
        `reasoner_joined(peer, hello)`: a reasoner registered; `place_worker(now)`: the pool a
        new worker joins; `adopt(worker, hello, now)`: a new worker said it runs a request;
        `peer_lost(peer, known, worker, reason, now)`: a peer is gone, after it was forgotten here."""
        self.settings = settings
        self.scheduler_id = scheduler_id
        self.join_secret = join_secret
        self.counters = counters
        self.reply = reply
        self.reasoner_start = reasoner_start
        self.reasoner_joined = reasoner_joined
        self.place_worker = place_worker
        self.adopt = adopt
        self.peer_lost = peer_lost
        self.peers: collections.OrderedDict[bytes, Peer] = collections.OrderedDict()   # least recently heard first
        self.workers: dict[bytes, WorkerState] = {}
        self.work_acks: dict[bytes, list[int]] = {}     # worker -> WorkDone call_ids not yet acked
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

    def set_busy(self, w: WorkerState, req: QueuedRequest, now: float) -> None:
        w.busy, w.busy_since = req, now
        self.idle[w.pool].pop(w.peer, None)
        self.workers_version += 1

    def set_idle(self, w: WorkerState) -> None:
        w.busy = None
        self.idle[w.pool][w.peer] = w
        self.workers_version += 1

    def set_pool(self, w: WorkerState, pool: Pool) -> None:
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

    def touch(self, known: Peer, now: float) -> None:
        # Peers stay ordered by when they were last heard from, so expiry reads only the silent ones.
        known.last_seen = now
        self.peers.move_to_end(known.id)

    def expire(self, now: float) -> None:
        timeout = self.settings.peer_timeout_s
        silent = []
        for p in self.peers.values():
            if now - p.last_seen <= timeout:
                break
            silent.append(p)
        for peer in silent:
            self.lose(peer.id, f"silent for more than {timeout:g} s (setting peer_timeout_s)", now)

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
        if msg.role == "reasoner":
            if not self._reasoner_may_join(peer, msg, now):
                return
        elif msg.role in AUTHENTICATED_ROLES and self.join_secret is not None:
            node = msg.node if msg.role == "worker" else ""
            if not check_credential(self.join_secret, msg.role, msg.name, node, msg.credential):
                self._refuse_hello(peer, msg, now)
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
            self.lose(peer, f"registered again as {msg.role} {msg.name}", now)
            known = None
        if known is None:
            # Another live peer with the same worker name is an older incarnation: it is gone.
            if msg.role == "worker":
                for other in [w for w in self.workers.values() if w.name == msg.name]:
                    self.lose(other.peer, "replaced by a new process of the same name", now)
            known = Peer(id=peer, role=msg.role, name=msg.name, last_seen=now, owner=owner,
                         curve_key=curve_key, admin=admin)
            self.peers[peer] = known
            log.info("%s %s joined", msg.role, msg.name)
        self.touch(known, now)
        if msg.role == "worker" and peer not in self.workers:
            self._add_worker(peer, msg, now)
        elif msg.role == "reasoner":
            self.reasoner_joined(peer, msg)
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

    def _reasoner_may_join(self, peer: bytes, msg: Hello, now: float) -> bool:
        """A reasoner registers only for its job's latest start: one of an earlier start (say,
        still exiting when a restarted scheduler started the next) is refused, and so cannot
        become the job's reasoner, whose messages are the only ones the job takes."""
        start = self.reasoner_start(msg.name)
        if start is None:
            # A start-bound credential cannot be checked without the job; one presenting none has
            # proved nothing, and is refused as any peer without a credential is.
            if self.join_secret is not None and not msg.credential:
                self._refuse_hello(peer, msg, now)
            else:
                self.reply(peer, ErrorReply(code="unknown_job", message=f"no running job {msg.name!r}"))
            return False
        if self.join_secret is None:
            return True
        earlier = reasoner_start_of(self.join_secret, msg.name, start, msg.credential)
        if earlier == start:
            return True
        if earlier is None:
            self._refuse_hello(peer, msg, now)
            return False
        self.counters["stale_reasoners_refused"] += 1
        log.info("refused a reasoner of job %s's start %d (peer %r): the job is on start %d",
                 msg.name, earlier, peer[:40], start)
        self.reply(peer, ErrorReply(code="stale_reasoner", message=(
            f"reasoner of start {earlier} of job {msg.name!r}: the job's reasoner is now start {start}")))
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
        self.reply(peer, HeartbeatAck(scheduler_id=self.scheduler_id, acked=self.take_acks(peer)))

    def on_goodbye(self, peer: bytes, msg: Goodbye, now: float) -> None:
        self.lose(peer, f"left: {msg.reason or 'goodbye'}", now)

    def on_dead_notice(self, peer: bytes, msg: DeadNotice, now: float) -> None:
        log.warning("%s reported a fatal error: %s", msg.name, msg.reason)
        self.lose(peer, f"fatal error: {msg.reason}", now)

    def on_worker_exited(self, peer: bytes, msg: WorkerExited, now: float) -> None:
        node = self.peers[peer].name   # a node speaks for its own workers only
        for w in [w for w in self.workers.values() if w.name == msg.name and w.node == node]:
            self.lose(w.peer, f"process exited with code {msg.exit_code} {msg.reason}".strip(), now)

    def lose(self, peer: bytes, reason: str, now: float) -> None:
        known = self.peers.pop(peer, None)
        self.work_acks.pop(peer, None)
        if known is not None:
            log.info("%s %s lost: %s", known.role, known.name, reason)
        self.peer_lost(peer, known, self._delist(peer), reason, now)

    def _add_worker(self, peer: bytes, msg: Hello, now: float) -> None:
        w = WorkerState(peer=peer, name=msg.name, node=msg.node, device=msg.device or "cpu",
                        pool=self.place_worker(now), pid=msg.pid, host=msg.host, sandbox=msg.sandbox)
        w.held.update(msg.held_results[:_MAX_HELD_RESULTS])
        self._enlist(w)
        if msg.busy_request_id:
            self.adopt(w, msg, now)

    # -- results' acks ------------------------------------------------------------------------
    def owe_ack(self, peer: bytes, call_id: int) -> None:
        """A result to acknowledge in the next message to this worker (its next assignment, else
        its next heartbeat's ack), all sent after the commit: a result needs no message of its own."""
        self.work_acks.setdefault(peer, []).append(call_id)

    def take_acks(self, peer: bytes) -> list[int]:
        return self.work_acks.pop(peer, [])
