"""The actor runtime's messages: every frame between the scheduler and its clients, workers, nodes
and reasoners, and `MESSAGE_TYPES`, which maps each frame's kind to its struct.

How a frame is laid out: messages/frames.py. Requests carry a `call_id` that their reply echoes;
fire-and-forget messages do not.
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal

from specgen.messages.evaluation import CandidateSubmission, CandidateUpdate, Stage
from specgen.messages.frames import PROTOCOL_VERSION, _Wire
from specgen.messages.jobs import JobEvent, JobResult, JobSpec, JobStatus
from specgen.messages.kv import KvPoolResize, KvPoolStats
from specgen.messages.stats import SchedulerStats

# What a peer of the scheduler is (`Hello.role`); runtime/worker_registry.py's ROLES is read from it.
PeerRole = Literal["client", "worker", "node", "reasoner"]


class Hello(_Wire):
    """First message of every peer to the scheduler (also sent again after a scheduler restart)."""

    KIND: ClassVar[int] = 1
    role: PeerRole
    name: str                               # unique per role, e.g. "node-a/cpu0" or a job id
    protocol_version: int = PROTOCOL_VERSION
    node: str = ""                          # worker: the node that runs it
    device: str = ""                        # worker: "cpu" | "cuda:N"
    pid: int = 0
    busy_request_id: str = ""               # worker: the request it is running now (after restarts)
    busy_key: list[str] = []                # worker: (job_id, candidate_id, stage) of that request
    host: str = ""                          # worker: host name (pairs it with KV pools on its device)
    credential: str = ""                    # worker, node, reasoner: proof of cluster membership, an
                                            # HMAC of role and name under the join secret (runtime/auth.py);
                                            # client: empty, or the admin's (role "admin"), see Welcome.admin
    client_token: str = ""                  # client: a random secret (32+ chars) naming it across
                                            # reconnections; without CURVE, the owner of its jobs
    held_results: list[str] = []            # worker: request ids of results it keeps until acknowledged
    sandbox: str = ""                       # worker: how its candidates run, "namespaces" | "none"
                                            # ("none: <why>" when no sandbox could be made); "" untold


class Welcome(_Wire):
    """The scheduler's answer to Hello."""

    KIND: ClassVar[int] = 2
    scheduler_id: str                       # changes when the scheduler restarts
    heartbeat_interval_s: float
    peer_timeout_s: float
    max_message_bytes: int
    admin: bool = False                     # client: its Hello carried a valid admin credential


class Heartbeat(_Wire):
    KIND: ClassVar[int] = 3
    sent_at: float = 0.0                    # wall clock
    busy_request_id: str = ""               # worker: the request it is running now
    health: dict[str, Any] = {}             # node: worker names -> state, restarts, ...


class HeartbeatAck(_Wire):
    KIND: ClassVar[int] = 4
    scheduler_id: str                       # a peer that sees a new id says Hello again
    acked: list[int] = []                   # worker: call_ids of results committed since (see WorkDone)


class ErrorReply(_Wire):
    """A message was refused. `ref` is the refused request's call_id when it could be read."""

    KIND: ClassVar[int] = 5
    code: str                               # "malformed" | "unknown_kind" | "version" | "too_large" |
                                            # "not_owner" (another client's job) | ...
    message: str                            # says what was wrong and what to fix
    ref: int = 0


class Goodbye(_Wire):
    """A peer is leaving on purpose; the scheduler re-queues its request at once."""

    KIND: ClassVar[int] = 6
    reason: str = ""
    busy_request_id: str = ""


class DeadNotice(_Wire):
    """An actor hit a fatal error and is exiting (to its supervisor and the scheduler)."""

    KIND: ClassVar[int] = 7
    name: str
    reason: str


class WorkerReady(_Wire):
    """Worker -> its node: the worker is up (evaluation service started)."""

    KIND: ClassVar[int] = 8
    name: str
    pid: int


class Ack(_Wire):
    """Generic success reply to a request that returns nothing else."""

    KIND: ClassVar[int] = 9
    call_id: int
    count: int = 0                          # request-specific (e.g. requests dropped by a cancel)


class SubmitCandidate(_Wire):
    """Queue a candidate for validation (then profiling); updates go to the sender. Taken only from
    the job's owner, its reasoner or the admin (the first submitter owns a job id new to the
    scheduler); anyone else gets ErrorReply "not_owner"."""

    KIND: ClassVar[int] = 10
    call_id: int
    submission: CandidateSubmission


class SubmitAck(_Wire):
    KIND: ClassVar[int] = 11
    call_id: int
    accepted: bool = True
    duplicate: bool = False                 # already known: nothing queued twice
    reason: str = ""                        # why it was not accepted


class CandidateUpdateNotice(_Wire):
    """Scheduler -> submitter: one stage of a candidate finished (or it was dropped)."""

    KIND: ClassVar[int] = 12
    update: CandidateUpdate


class EvaluateRequest(_Wire):
    """Evaluate one candidate, outside any job; answered by EvaluateReply, and meanwhile by
    EvaluateQueued notices when `progress_interval_s` asks for them."""

    KIND: ClassVar[int] = 13
    call_id: int
    submission: CandidateSubmission
    stage: Stage = "full"
    progress_interval_s: float = 0.0        # want an EvaluateQueued when queued, then this often until
                                            # the reply (0: none); the client's is call_timeout_s / 4


class EvaluateReply(_Wire):
    KIND: ClassVar[int] = 14
    call_id: int
    update: CandidateUpdate


class EvaluateQueued(_Wire):
    """Scheduler -> caller: its EvaluateRequest is alive, still waiting or running (sent when it is
    queued, then every `progress_interval_s` it asked for); the caller keeps waiting for the reply."""

    KIND: ClassVar[int] = 34
    call_id: int                            # the EvaluateRequest's
    position: int = 0                       # place in its pool's queue, 1 = next (0 while running)
    queued: int = 0                         # requests waiting in that pool, every caller's
    running: bool = False                   # a worker is evaluating it now


class CancelJob(_Wire):
    """Drop the job's queued work, stop its running work and its reasoner; answered by Ack.
    Owner, reasoner or admin only (else ErrorReply "not_owner")."""

    KIND: ClassVar[int] = 15
    call_id: int
    job_id: str


class CreateJob(_Wire):
    """Start a job (its reasoner runs the optimize loop); answered by JobCreated. The sender owns
    the job; an id already taken by another client is refused ("not_owner")."""

    KIND: ClassVar[int] = 16
    call_id: int
    spec: JobSpec


class JobCreated(_Wire):
    KIND: ClassVar[int] = 17
    call_id: int
    job_id: str


class SubscribeJob(_Wire):
    """Send me the job's events after `after_seq` (from the journal), then new ones; Ack.
    Owner, reasoner or admin only (else ErrorReply "not_owner")."""

    KIND: ClassVar[int] = 18
    call_id: int
    job_id: str
    after_seq: int = 0


class JobEventNotice(_Wire):
    KIND: ClassVar[int] = 19
    event: JobEvent


class GetJob(_Wire):
    """Ask for a job's spec and state; answered by JobStatusReply. Owner, reasoner or admin only."""

    KIND: ClassVar[int] = 20
    call_id: int
    job_id: str


class JobStatusReply(_Wire):
    KIND: ClassVar[int] = 21
    call_id: int
    status: JobStatus


class ReportJobEvent(_Wire):
    """Reasoner -> scheduler: progress of its job (journaled, forwarded to subscribers)."""

    KIND: ClassVar[int] = 22
    event: JobEvent


class ReportJobResult(_Wire):
    """Reasoner -> scheduler: its job ended; answered by Ack once journaled."""

    KIND: ClassVar[int] = 23
    call_id: int
    result: JobResult


class ResyncUpdates(_Wire):
    """After a scheduler restart: send me again every recorded update of these jobs; Ack. Every
    job must be the sender's (else ErrorReply "not_owner", and nothing is sent)."""

    KIND: ClassVar[int] = 24
    call_id: int
    job_ids: list[str]


class GetStats(_Wire):
    KIND: ClassVar[int] = 25
    call_id: int


class StatsReply(_Wire):
    KIND: ClassVar[int] = 26
    call_id: int
    stats: SchedulerStats


class Ping(_Wire):
    """Answered by Pong at once (connectivity checks and wire benchmarks)."""

    KIND: ClassVar[int] = 27
    call_id: int
    payload: bytes = b""


class Pong(_Wire):
    KIND: ClassVar[int] = 28
    call_id: int
    payload: bytes = b""


class AssignWork(_Wire):
    """Scheduler -> worker: run one stage of one candidate."""

    KIND: ClassVar[int] = 30
    request_id: str                         # unique per attempt
    stage: Stage
    submission: CandidateSubmission
    acked: list[int] = []                   # call_ids of this worker's results committed since (see WorkDone)


class WorkDone(_Wire):
    """Worker -> scheduler: the stage finished (the verdict may say the candidate failed)."""

    KIND: ClassVar[int] = 31
    request_id: str
    update: CandidateUpdate
    call_id: int = 0                        # acked in the next AssignWork or HeartbeatAck (no message of
                                            # its own); the worker re-sends unacked results after a restart


class CancelWork(_Wire):
    """Scheduler -> worker: stop this request (its candidate's job no longer wants it)."""

    KIND: ClassVar[int] = 32
    request_id: str


class WorkerExited(_Wire):
    """Node -> scheduler: a worker process ended (the node restarts it)."""

    KIND: ClassVar[int] = 33
    name: str
    exit_code: int
    reason: str = ""


# One kind space for every channel: a frame that reaches the wrong channel still decodes, and is
# refused for its type rather than read as something else.
MESSAGE_TYPES: dict[int, type[_Wire]] = {
    cls.KIND: cls
    for cls in (
        Hello, Welcome, Heartbeat, HeartbeatAck, ErrorReply, Goodbye, DeadNotice, WorkerReady, Ack,
        SubmitCandidate, SubmitAck, CandidateUpdateNotice, EvaluateRequest, EvaluateReply,
        CancelJob, CreateJob, JobCreated, SubscribeJob, JobEventNotice, GetJob, JobStatusReply,
        ReportJobEvent, ReportJobResult, ResyncUpdates, GetStats, StatsReply, Ping, Pong,
        AssignWork, WorkDone, CancelWork, WorkerExited, EvaluateQueued, KvPoolStats, KvPoolResize,
    )
}
