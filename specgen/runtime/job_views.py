"""What a job's clients read of it: its status (GetJob), its events (SubscribeJob: those journaled
after a sequence number, then each as it comes) and its verdicts again (ResyncUpdates, after a
reconnection), of a running job from the job book, of an ended one from the journal.

A part of `SchedulerCore` (scheduler_core.py). It holds no state of its own: a subscription is
the job's (`JobState.subscribers`), and a client that resyncs a running job's updates receives
the ones to come (`JobState.submitter`). Each request passes the job book's gate first
(job_access.py).
"""
from __future__ import annotations

from typing import Callable, Mapping

from specgen.messages import (
    Ack, CandidateUpdateNotice, GetJob, JobEventNotice, JobStatus, JobStatusReply, ResyncUpdates, SubscribeJob,
    _Wire,
)
from specgen.runtime.job_access import JobAccess
from specgen.runtime.job_book import JobState
from specgen.runtime.journal import Journal


class JobViews:
    def __init__(self, jobs: Mapping[str, JobState], journal: Journal, access: JobAccess,
                 reply: Callable[[bytes, _Wire], None]) -> None:
        """`jobs`: the job book's running jobs; `access`: its gate."""
        self.jobs = jobs
        self.journal = journal
        self.access = access
        self.reply = reply

    def on_subscribe(self, peer: bytes, msg: SubscribeJob, now: float) -> None:
        if not self.access.may_act_on(peer, msg.job_id, "follow", msg.call_id):
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
        if self.access.may_act_on(peer, msg.job_id, "read", msg.call_id):
            status = self.job_status(msg.job_id)
            assert status is not None
            self.reply(peer, JobStatusReply(call_id=msg.call_id, status=status))

    def on_resync(self, peer: bytes, msg: ResyncUpdates, now: float) -> None:
        # All or nothing: one job that is not the sender's refuses the whole request.
        for job_id in msg.job_ids:
            owner = self.access.owner_of(job_id)
            if not self.access.may_act(peer, job_id, owner, "resync the updates of", msg.call_id):
                return
        for job_id in msg.job_ids:
            job = self.jobs.get(job_id)
            updates = list(job.updates.values()) if job is not None else self.journal.updates_of(job_id)
            if job is not None:
                job.submitter = peer
            for upd in updates:
                self.reply(peer, CandidateUpdateNotice(update=upd))
        self.reply(peer, Ack(call_id=msg.call_id))
