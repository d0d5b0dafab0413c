"""The scheduler core's job book: jobs and their states, their candidates and verdicts, their
events, and what of them goes to the journal.

A part of `SchedulerCore` (scheduler_core.py). It owns `jobs` and `jobs_finished`. A job's
requests enter the queues (the assignment policy's, reached through what the core hands in) here
(`_enqueue_job_request`) and leave them here with a recorded result (`complete`) or a drop
(`drop`); a one-off request's result or drop goes back to the assignment policy, whose it is.

A job's requests are taken only from those who may act for it (runtime/ownership.py; the gate,
`access`, is job_access.py): its owner, bound here when the job is created or first submitted to
and journaled with it, its reasoner and the admin. A refusal changes nothing of the job.
"""
from __future__ import annotations

import collections
import heapq
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Mapping

import msgspec

from specgen.clock import Clock
from specgen.messages import (
    Ack, CancelJob, CancelWork, CandidateSubmission, CandidateUpdate, CandidateUpdateNotice, CreateJob,
    ErrorReply, Hello, JobCreated, JobEvent, JobEventNotice, JobResult, JobSpec, ReportJobEvent,
    ReportJobResult, SubmitAck, SubmitCandidate, Verdict, _Wire,
)
from specgen.runtime.engine_sources import ENGINE_OPTION, refusal as engine_refusal
from specgen.runtime.ids import new_job_id
from specgen.runtime.journal import Journal
from specgen.runtime.job_access import JobAccess
from specgen.runtime.priority import QueuedRequest
from specgen.runtime.settings import RuntimeSettings

if TYPE_CHECKING:
    from specgen.runtime.worker_registry import Peer, WorkerState

log = logging.getLogger("specgen.runtime.scheduler_core")   # one logger for the whole core

Key = tuple[str, str, str]


@dataclass
class JobState:
    spec: JobSpec
    has_reasoner: bool
    attempts: int = 0
    state: str = "running"
    owner: str = ""                           # the identity that may act for it (runtime/ownership.py)
    submitter: bytes | None = None           # receives CandidateUpdates (reasoner or backend)
    reasoner_peer: bytes | None = None
    reasoner_started: float = 0.0             # monotonic; 0 = not started by us
    reasoner_deaths: int = 0                  # reasoners of this job that exited without a result
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


class JobBook:
    """Jobs, their candidates, verdicts and events."""

    def __init__(
        self,
        settings: RuntimeSettings,
        journal: Journal,
        clock: Clock,
        wall: Callable[[], float],
        seq: Iterator[int],
        counters: collections.Counter,
        reply: Callable[[bytes, _Wire], None],
        *,
        peers: Mapping[bytes, Peer],
        workers: Mapping[bytes, WorkerState],
        running: Mapping[str, QueuedRequest],
        push: Callable[..., None],
        unqueue: Callable[[QueuedRequest], None],
        total_queued: Callable[[], int],
        answer_direct: Callable[[QueuedRequest, CandidateUpdate], None],
        act: Callable[[str, str], None],
        on_feedback: Callable[[float], None],
    ) -> None:
        """`peers` and `workers` are the worker registry's; `running`, `push`, `unqueue`,
        `total_queued` and `answer_direct` (a one-off request's result) the assignment policy's.
        `act(action, job_id)`: start or stop a job's reasoner; `on_feedback(latency)`: a profiling
        verdict's feedback latency (from the candidate's extraction to its verdict)."""
        self.settings = settings
        self.journal = journal
        self.clock = clock
        self.wall = wall
        self.seq = seq
        self.counters = counters
        self.reply = reply
        self.peers = peers
        self.workers = workers
        self.running = running
        self.push = push
        self.unqueue = unqueue
        self.total_queued = total_queued
        self.answer_direct = answer_direct
        self.act = act
        self.on_feedback = on_feedback
        self.access = JobAccess(peers, self.owner_of, counters, clock, reply)
        self.jobs: dict[str, JobState] = {}
        # When a running job may next be due to end by itself, so that a tick looks at those jobs
        # only: (monotonic time, job id) of reasoners to register by, (wall time, job id) of deadlines.
        self._reasoner_due: list[tuple[float, str]] = []
        self._deadline_due: list[tuple[float, str]] = []
        self.jobs_finished: collections.Counter[str] = collections.Counter()   # by result status

    def resume(self) -> None:
        """Rebuild running jobs from the journal: re-queue every stage that has no verdict yet."""
        for rec in self.journal.unfinished_jobs():
            job = JobState(spec=rec.spec, has_reasoner=rec.has_reasoner, attempts=rec.attempts,
                           last_seq=rec.last_seq, owner=rec.owner)
            self._add_job(job)
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

    def _add_job(self, job: JobState) -> None:
        self.jobs[job.spec.job_id] = job
        if job.spec.deadline is not None:
            heapq.heappush(self._deadline_due, (job.spec.deadline + self.settings.job_grace_s, job.spec.job_id))

    def _watch_reasoner(self, job: JobState) -> None:
        """The job's reasoner is (again) to register: check it once `ready_timeout_s` has passed."""
        if job.has_reasoner and job.reasoner_started:
            heapq.heappush(self._reasoner_due, (job.reasoner_started + self.settings.ready_timeout_s,
                                                job.spec.job_id))

    def is_running(self, job_id: str) -> bool:
        job = self.jobs.get(job_id)
        return job is not None and job.state == "running"

    def expire(self, now: float) -> None:
        # Only the jobs whose check is due: a tick costs nothing per job otherwise.
        while self._reasoner_due and self._reasoner_due[0][0] < now:
            job = self.jobs.get(heapq.heappop(self._reasoner_due)[1])
            if (job is not None and job.state == "running" and job.has_reasoner and job.reasoner_peer is None
                    and job.reasoner_started and now - job.reasoner_started > self.settings.ready_timeout_s):
                self._finish_job(job, JobResult(
                    job_id=job.spec.job_id, status="failed",
                    error=f"the job's reasoner did not register within "
                          f"{self.settings.ready_timeout_s:g} s (setting ready_timeout_s)"), now)
        wall = self.wall()
        while self._deadline_due and self._deadline_due[0][0] < wall:
            job = self.jobs.get(heapq.heappop(self._deadline_due)[1])
            if (job is not None and job.state == "running" and job.spec.deadline is not None
                    and wall > job.spec.deadline + self.settings.job_grace_s):
                self._finish_job(job, JobResult(
                    job_id=job.spec.job_id, status="timed_out",
                    error=f"wall time of {job.spec.wall_time_s:g} s used up and the reasoner did not "
                          f"finish within {self.settings.job_grace_s:g} s more (setting job_grace_s)"), now)

    def owner_of(self, job_id: str) -> str | None:
        """The owner of a running or journaled job; None when the scheduler never had it."""
        job = self.jobs.get(job_id)
        if job is not None:
            return job.owner
        rec = self.journal.job(job_id)
        return rec.owner if rec is not None else None

    # -- peers ------------------------------------------------------------------------------
    def reasoner_joined(self, peer: bytes, msg: Hello) -> None:
        """The job's reasoner registered (a job of that id is running: the registry asked first)."""
        job = self.jobs[msg.name]
        if job.reasoner_peer != peer:
            job.reasoner_peer = peer
            job.submitter = peer
            job.subscribers.discard(peer)
            self._emit(job, "reasoner_started", {"attempt": job.attempts, "pid": msg.pid})

    def forget_peer(self, peer: bytes) -> None:
        """A peer is gone: it follows no job, and submits for none."""
        for job in self.jobs.values():
            job.subscribers.discard(peer)
            if job.reasoner_peer == peer:
                job.reasoner_peer = None
                self._watch_reasoner(job)   # it has ready_timeout_s from its start to come back
            if job.submitter == peer:
                job.submitter = None

    # -- candidates and verdicts --------------------------------------------------------------
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
        self.push(req, self.clock.now() if now is None else now, count_arrival)

    def on_submit(self, peer: bytes, msg: SubmitCandidate, now: float) -> None:
        sub = msg.submission
        if not sub.job_id or not sub.candidate_id:
            self.reply(peer, ErrorReply(code="bad_request", ref=msg.call_id, message=(
                "submission needs a job_id and a candidate_id (use EvaluateRequest for a one-off candidate)")))
            return
        known = self.peers[peer]
        if known.role == "reasoner" and known.name != sub.job_id:
            # A reasoner acts for its own job, never for a job id it would make up.
            self.access.refuse(peer, sub.job_id, "submit candidates to", msg.call_id)
            return
        job = self.jobs.get(sub.job_id)
        if job is None:
            rec = self.journal.job(sub.job_id)
            if rec is not None:
                if self.access.may_act(peer, sub.job_id, rec.owner, "submit candidates to", msg.call_id):
                    self.reply(peer, SubmitAck(call_id=msg.call_id, accepted=False, reason=(
                        f"job {sub.job_id} has ended ({rec.result.status if rec.result else rec.state})")))
                return
            # A job the submitter runs itself (no reasoner here), e.g. an optimize loop in its own
            # process: the first submitter owns it.
            spec = JobSpec(job_id=sub.job_id, problem_name=sub.problem_name, created_at=self.wall())
            job = JobState(spec=spec, has_reasoner=False, owner=known.owner)
            self._add_job(job)
            self.journal.put_job(spec, "running", False, 0, owner=job.owner)
        elif not self.access.may_act(peer, sub.job_id, job.owner, "submit candidates to", msg.call_id):
            return
        if job.submitter != peer:
            job.submitter = peer
        if sub.candidate_id in job.candidates:
            # Known (a resumed reasoner submits again): nothing is queued twice; replay its verdicts.
            for (cid, _stage), upd in job.updates.items():
                if cid == sub.candidate_id:
                    self.reply(peer, CandidateUpdateNotice(update=upd))
            self.reply(peer, SubmitAck(call_id=msg.call_id, duplicate=True))
            return
        if self.total_queued() >= self.settings.max_queued_requests:
            self.counters["refused_busy"] += 1
            self.reply(peer, SubmitAck(call_id=msg.call_id, accepted=False, reason=(
                f"busy: {self.total_queued()} requests queued (setting max_queued_requests)")))
            return
        job.candidates[sub.candidate_id] = sub
        self.journal.put_candidate(sub)
        self._enqueue_job_request(job, sub, "validate", now=now)
        self.reply(peer, SubmitAck(call_id=msg.call_id))

    def complete(self, req: QueuedRequest, upd: CandidateUpdate, now: float) -> None:
        self.counters["requests_done"] += 1
        if req.direct:
            self.answer_direct(req, upd)
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
            self.on_feedback(max(0.0, upd.finished_at - sub.extracted_at))
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

    def drop(self, req: QueuedRequest, reason: str) -> None:
        """Answer a request that will never run (cancelled update / reply)."""
        self.counters["requests_dropped"] += 1
        upd = CandidateUpdate(
            job_id=req.key[0], candidate_id=req.submission.candidate_id if req.direct else req.key[1],
            stage=req.stage, verdict=Verdict(stage=req.stage, error=f"cancelled: {reason}",
                                                    code="cancelled"),
            finished_at=self.wall(), cancelled=True)
        if req.direct:
            self.answer_direct(req, upd)
            return
        job = self.jobs.get(req.key[0])
        if job is None:
            return
        job.live.pop(req.key, None)
        if job.state == "running":
            self._record_update(job, upd)
        elif job.submitter is not None:
            self.reply(job.submitter, CandidateUpdateNotice(update=upd))

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
        self._watch_reasoner(job)
        self.journal.put_job(job.spec, "running", True, job.attempts, owner=job.owner)
        self.act("start_reasoner", job.spec.job_id)

    def on_create_job(self, peer: bytes, msg: CreateJob, now: float) -> None:
        spec = msg.spec
        if not spec.job_id:
            spec.job_id = new_job_id()
        owner = self.owner_of(spec.job_id)
        if owner is not None:
            # Idempotent for its owner (CreateJob sent again after a restart); an id another
            # client holds is not theirs to create.
            if self.access.may_act(peer, spec.job_id, owner, "create", msg.call_id):
                self.reply(peer, JobCreated(call_id=msg.call_id, job_id=spec.job_id))
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
        if not self.peers[peer].admin:
            # What the job's engine names is opened on this host by its reasoner: a plain client
            # names only what the setting engine_sources allows (checked on the strings alone).
            refused = engine_refusal(spec.options.get(ENGINE_OPTION), self.settings.engine_sources)
            if refused:
                self.counters["jobs_refused"] += 1
                self.reply(peer, ErrorReply(code="bad_request", ref=msg.call_id, message=refused))
                return
        spec.created_at = self.wall()
        if spec.wall_time_s is not None:
            spec.deadline = spec.created_at + spec.wall_time_s
        job = JobState(spec=spec, has_reasoner=True, owner=self.peers[peer].owner)
        self._add_job(job)
        job.subscribers.add(peer)
        self._emit(job, "created", {"problem_name": spec.problem_name, "entry": spec.entry})
        self._start_reasoner(job, now)
        self.reply(peer, JobCreated(call_id=msg.call_id, job_id=spec.job_id))

    def on_cancel_job(self, peer: bytes, msg: CancelJob, now: float) -> None:
        if not self.access.may_act_on(peer, msg.job_id, "cancel", msg.call_id):
            return
        job = self.jobs.get(msg.job_id)
        if job is None:
            self.reply(peer, Ack(call_id=msg.call_id))   # it has ended already
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
        self.journal.put_job(job.spec, "finished", job.has_reasoner, job.attempts, result, owner=job.owner)
        self._emit(job, "finished", msgspec.to_builtins(result))
        if job.has_reasoner:
            self.act("stop_reasoner", job.spec.job_id)
        self.jobs_finished[result.status] += 1
        del self.jobs[job.spec.job_id]
        return dropped

    def _drop_job_work(self, job: JobState, reason: str) -> int:
        """Drop the job's queued requests and stop its running ones (each gets a cancelled update
        now; a stopped request's own late answer is then ignored). Returns how many."""
        dropped = 0
        holders = None
        for req in list(job.live.values()):
            if req.request_id and req.request_id in self.running:
                if holders is None:   # one walk over the workers per job, not one per request
                    holders = {id(w.busy): w for w in self.workers.values() if w.busy is not None}
                w = holders.get(id(req))
                if w is not None:
                    self.reply(w.peer, CancelWork(request_id=req.request_id))
            else:
                self.unqueue(req)
            self.drop(req, reason)
            dropped += 1
        return dropped

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
        job.reasoner_deaths += 1
        # `detail` is the end of the reasoner's log: tracebacks, the engine's own logging, paths
        # of this host. It stays in this host's log; the job's followers are told where it is.
        log.warning("job %s: the end of its reasoner's log:\n%s", job_id, detail or "(empty)")
        where = "its log on the scheduler's host says why"
        if job.reasoner_deaths <= self.settings.reasoner_max_restarts:
            # The job goes on: a new reasoner runs the loop again, and what the dead one submitted
            # is neither queued twice nor evaluated again (its verdicts are replayed to the new one),
            # as after a scheduler restart.
            self._emit(job, "reasoner_restarted", {"exit_code": exit_code, "detail": where,
                                                   "restarts": job.reasoner_deaths})
            log.warning("job %s: reasoner exited with code %s; starting it again (%d of %d)",
                        job_id, exit_code, job.reasoner_deaths, self.settings.reasoner_max_restarts)
            self._start_reasoner(job, now)
            return
        self._finish_job(job, JobResult(
            job_id=job_id, status="failed",
            error=f"the job's reasoner exited with code {exit_code} before reporting a result, "
                  f"{job.reasoner_deaths} times (setting reasoner_max_restarts); {where}"), now)
