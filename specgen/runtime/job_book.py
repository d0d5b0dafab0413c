"""The scheduler core's job book: jobs and their states, their candidates and verdicts, their
events, and what of them goes to the journal.

Part of `SchedulerCore` (scheduler_core.py), which composes it with the worker registry
(worker_registry.py) and the assignment policy (assignment.py); all three share one state on the
core. This part owns `jobs`, `jobs_finished` and the feedback latencies. A job's requests enter
the queues here (`_enqueue_job_request`) and leave them here with a recorded result
(`_complete`) or a drop (`_drop`); one-off requests (`EvaluateRequest`) belong to no job and are
answered straight to their caller.

A job's requests are taken only from those who may act for it (runtime/ownership.py): its owner,
bound here when the job is created or first submitted to and journaled with it, its reasoner
and the admin. A refusal (`_refuse_not_owner`) changes nothing of the job.
"""
from __future__ import annotations

import collections
import heapq
import logging
import math
from dataclasses import dataclass, field
from typing import Callable

import msgspec

from specgen.messages import (
    Ack, CancelJob, CancelWork, CandidateSubmission, CandidateUpdate, CandidateUpdateNotice, CreateJob,
    ErrorReply, EvaluateReply, GetJob, JobCreated, JobEvent, JobEventNotice, JobResult, JobSpec, JobStatus,
    JobStatusReply, ReportJobEvent, ReportJobResult, ResyncUpdates, SubmitAck, SubmitCandidate,
    SubscribeJob, Verdict,
)
from specgen.runtime.ids import new_job_id
from specgen.runtime.ownership import may_act_for, not_owner
from specgen.runtime.priority import QueuedRequest

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
    """Jobs, their candidates, verdicts and events (a mixin of `SchedulerCore`).

    Uses from the core: `settings`, `journal`, `scheduler_id`, `clock` and `wall`, `seq`,
    `counters`, `actions`, `reply()`; the worker registry's `peers`, `workers`; the assignment
    policy's `running`, `direct`, `_push`, `_unqueue`, `_total_queued`.
    """

    def init_jobs(self) -> None:
        self.jobs: dict[str, JobState] = {}
        # When a running job may next be due to end by itself, so that a tick looks at those jobs
        # only: (monotonic time, job id) of reasoners to register by, (wall time, job id) of deadlines.
        self._reasoner_due: list[tuple[float, str]] = []
        self._deadline_due: list[tuple[float, str]] = []
        self.feedback_latencies: collections.deque[float] = collections.deque(maxlen=20_000)
        self.jobs_finished: collections.Counter[str] = collections.Counter()   # by result status
        # Called with each feedback latency as it is recorded (the metrics' histogram).
        self.feedback_observer: Callable[[float], None] | None = None
        self._not_owner_logged: dict[str, float] = {}   # peer name -> last not-owner warning

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

    def _expire_jobs(self, now: float) -> None:
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

    # -- ownership ----------------------------------------------------------------------------
    def _owner_of(self, job_id: str) -> str | None:
        """The owner of a running or journaled job; None when the scheduler never had it."""
        job = self.jobs.get(job_id)
        if job is not None:
            return job.owner
        rec = self.journal.job(job_id)
        return rec.owner if rec is not None else None

    def _refuse_not_owner(self, peer: bytes, job_id: str, action: str, ref: int) -> None:
        self.counters["requests_not_owner"] += 1
        known = self.peers[peer]
        now = self.clock.now()
        last = self._not_owner_logged.get(known.name)
        if last is None or now - last > 60.0:   # one warning per peer a minute
            if len(self._not_owner_logged) > 1000:
                self._not_owner_logged.clear()
            self._not_owner_logged[known.name] = now
            log.warning("refused %s %r (peer %r): may not %s job %s, another's", known.role, known.name,
                        peer[:40], action, job_id)
        self.reply(peer, not_owner(job_id, action, ref))

    def _may_act(self, peer: bytes, job_id: str, owner: str | None, action: str, ref: int) -> bool:
        """Whether `peer` may act for the job (`owner`: see _owner_of); if not, it is told so."""
        if owner is None or may_act_for(self.peers[peer], job_id, owner):
            return True
        self._refuse_not_owner(peer, job_id, action, ref)
        return False

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
        self._push(req, self.clock.now() if now is None else now, count_arrival)

    def on_submit(self, peer: bytes, msg: SubmitCandidate, now: float) -> None:
        sub = msg.submission
        if not sub.job_id or not sub.candidate_id:
            self.reply(peer, ErrorReply(code="bad_request", ref=msg.call_id, message=(
                "submission needs a job_id and a candidate_id (use EvaluateRequest for a one-off candidate)")))
            return
        known = self.peers[peer]
        if known.role == "reasoner" and known.name != sub.job_id:
            # A reasoner acts for its own job, never for a job id it would make up.
            self._refuse_not_owner(peer, sub.job_id, "submit candidates to", msg.call_id)
            return
        job = self.jobs.get(sub.job_id)
        if job is None:
            rec = self.journal.job(sub.job_id)
            if rec is not None:
                if self._may_act(peer, sub.job_id, rec.owner, "submit candidates to", msg.call_id):
                    self.reply(peer, SubmitAck(call_id=msg.call_id, accepted=False, reason=(
                        f"job {sub.job_id} has ended ({rec.result.status if rec.result else rec.state})")))
                return
            # A job the submitter runs itself (no reasoner here), e.g. an optimize loop in its own
            # process: the first submitter owns it.
            spec = JobSpec(job_id=sub.job_id, problem_name=sub.problem_name, created_at=self.wall())
            job = JobState(spec=spec, has_reasoner=False, owner=known.owner)
            self._add_job(job)
            self.journal.put_job(spec, "running", False, 0, owner=job.owner)
        elif not self._may_act(peer, sub.job_id, job.owner, "submit candidates to", msg.call_id):
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
        if self._total_queued() >= self.settings.max_queued_requests:
            self.counters["refused_busy"] += 1
            self.reply(peer, SubmitAck(call_id=msg.call_id, accepted=False, reason=(
                f"busy: {self._total_queued()} requests queued (setting max_queued_requests)")))
            return
        job.candidates[sub.candidate_id] = sub
        self.journal.put_candidate(sub)
        self._enqueue_job_request(job, sub, "validate", now=now)
        self.reply(peer, SubmitAck(call_id=msg.call_id))

    def _complete(self, req: QueuedRequest, upd: CandidateUpdate, now: float) -> None:
        self.counters["requests_done"] += 1
        if req.direct:
            self._answer_direct(req, upd)
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

    def _answer_direct(self, req: QueuedRequest, upd: CandidateUpdate) -> None:
        """A one-off evaluation (no job) is answered to its caller, if it still waits."""
        self.direct.pop(req.key, None)
        if req.reply_to is not None:
            self.reply(req.reply_to, EvaluateReply(call_id=req.call_id, update=upd))

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
            stage=req.stage, verdict=Verdict(stage=req.stage, error=f"cancelled: {reason}",
                                                    code="cancelled"),
            finished_at=self.wall(), cancelled=True)
        if req.direct:
            self._answer_direct(req, upd)
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
        self.actions.append(("start_reasoner", job.spec.job_id))

    def on_create_job(self, peer: bytes, msg: CreateJob, now: float) -> None:
        spec = msg.spec
        if not spec.job_id:
            spec.job_id = new_job_id()
        owner = self._owner_of(spec.job_id)
        if owner is not None:
            # Idempotent for its owner (CreateJob sent again after a restart); an id another
            # client holds is not theirs to create.
            if self._may_act(peer, spec.job_id, owner, "create", msg.call_id):
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
        spec.created_at = self.wall()
        if spec.wall_time_s is not None:
            spec.deadline = spec.created_at + spec.wall_time_s
        job = JobState(spec=spec, has_reasoner=True, owner=self.peers[peer].owner)
        self._add_job(job)
        job.subscribers.add(peer)
        self._emit(job, "created", {"problem_name": spec.problem_name, "entry": spec.entry})
        self._start_reasoner(job, now)
        self.reply(peer, JobCreated(call_id=msg.call_id, job_id=spec.job_id))

    def _may_act_on(self, peer: bytes, job_id: str, verb: str, call_id: int) -> bool:
        """Whether `peer` may `verb` the job; else answered (unknown job, or not its owner)."""
        owner = self._owner_of(job_id)
        if owner is None:
            self.reply(peer, ErrorReply(code="unknown_job", ref=call_id, message=f"no job {job_id!r}"))
            return False
        return self._may_act(peer, job_id, owner, verb, call_id)

    def on_cancel_job(self, peer: bytes, msg: CancelJob, now: float) -> None:
        if not self._may_act_on(peer, msg.job_id, "cancel", msg.call_id):
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
            self.actions.append(("stop_reasoner", job.spec.job_id))
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
                self._unqueue(req)
            self._drop(req, reason)
            dropped += 1
        return dropped

    def on_subscribe(self, peer: bytes, msg: SubscribeJob, now: float) -> None:
        if not self._may_act_on(peer, msg.job_id, "follow", msg.call_id):
            return
        job = self.jobs.get(msg.job_id)
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
        if self._may_act_on(peer, msg.job_id, "read", msg.call_id):
            status = self.job_status(msg.job_id)
            assert status is not None
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
        job.reasoner_deaths += 1
        if job.reasoner_deaths <= self.settings.reasoner_max_restarts:
            # The job goes on: a new reasoner runs the loop again, and what the dead one submitted
            # is neither queued twice nor evaluated again (its verdicts are replayed to the new one),
            # as after a scheduler restart.
            self._emit(job, "reasoner_restarted", {"exit_code": exit_code, "detail": detail[-500:],
                                                   "restarts": job.reasoner_deaths})
            log.warning("job %s: reasoner exited with code %s; starting it again (%d of %d)",
                        job_id, exit_code, job.reasoner_deaths, self.settings.reasoner_max_restarts)
            self._start_reasoner(job, now)
            return
        self._finish_job(job, JobResult(
            job_id=job_id, status="failed",
            error=f"the job's reasoner exited with code {exit_code} before reporting a result, "
                  f"{job.reasoner_deaths} times (setting reasoner_max_restarts)"
                  + (f": {detail}" if detail else "")), now)

    def on_resync(self, peer: bytes, msg: ResyncUpdates, now: float) -> None:
        # All or nothing: one job that is not the sender's refuses the whole request.
        for job_id in msg.job_ids:
            if not self._may_act(peer, job_id, self._owner_of(job_id), "resync the updates of", msg.call_id):
                return
        for job_id in msg.job_ids:
            job = self.jobs.get(job_id)
            updates = list(job.updates.values()) if job is not None else self.journal.updates_of(job_id)
            if job is not None:
                job.submitter = peer
            for upd in updates:
                self.reply(peer, CandidateUpdateNotice(update=upd))
        self.reply(peer, Ack(call_id=msg.call_id))
