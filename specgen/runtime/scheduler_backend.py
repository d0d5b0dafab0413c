"""`EvaluationBackend` (specgen/backend.py) over a scheduler client, for asyncio code.

    backend = SchedulerEvaluationBackend(client)
    await backend.submit(candidate)            # returns once the scheduler journaled it
    async for update in backend.updates(): ...
    await backend.cancel_job(job_id)
    backend.load()                              # BackendLoad, refreshed in the background

At most `max_outstanding_submits` submissions wait for their acknowledgement at once, and a
scheduler that reports "busy" (its queue is at `max_queued_requests`) is retried with backoff, so
a burst of forks cannot overrun the scheduler's sockets. Each (job, candidate, stage) update is
delivered once, even when the scheduler re-sends after a restart.
"""
from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import AsyncIterator

from specgen.messages import CancelJob, CandidateSubmission, CandidateUpdate, GetStats, SubmitCandidate
from specgen.backend import BackendLoad
from specgen.runtime.client import Client
from specgen.runtime.transport import CallTimeout, RemoteError, RuntimeFailure

_LOAD_REFRESH_S = 0.25


class SubmissionRefused(RuntimeFailure):
    pass


class SchedulerEvaluationBackend:
    def __init__(self, client: Client, *, max_outstanding: int | None = None) -> None:
        self.client = client
        self.settings = client.settings
        self._max_outstanding = max_outstanding or self.settings.max_outstanding_submits
        self._semaphore: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._buffer: collections.deque[CandidateUpdate] = collections.deque()
        self._seen: set[tuple[str, str, str]] = set()
        self._jobs: set[str] = set()
        self._lock = threading.Lock()
        self._load = BackendLoad()
        self._load_at = 0.0
        self._load_pending = False
        self.refused_busy = 0
        client.add_update_sink(self._deliver, self._job_ids)

    def close(self) -> None:
        self.client.remove_update_sink(self._deliver)

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._event = asyncio.Event()
            self._semaphore = asyncio.Semaphore(self._max_outstanding)
            if self._buffer:
                self._event.set()

    # -- whichever thread drives the connection ------------------------------------------
    def _job_ids(self) -> list[str]:
        return sorted(self._jobs)

    def _deliver(self, update: CandidateUpdate) -> None:
        key = (update.job_id, update.candidate_id, update.stage)
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
            self._buffer.append(update)
            loop, event = self._loop, self._event
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:   # the loop closed
                pass

    # -- EvaluationBackend ------------------------------------------------------------------
    async def submit(self, candidate: CandidateSubmission) -> None:
        self._bind_loop()
        assert self._semaphore is not None
        self._jobs.add(candidate.job_id)
        deadline = time.monotonic() + self.settings.call_timeout_s
        backoff = 0.01
        async with self._semaphore:
            while True:
                fut = self.client.conn.call(SubmitCandidate(call_id=0, submission=candidate))
                try:
                    ack = await asyncio.wait_for(asyncio.wrap_future(fut), self.settings.call_timeout_s)
                except asyncio.TimeoutError:
                    raise CallTimeout(
                        f"submission of {candidate.candidate_id} got no answer within "
                        f"{self.settings.call_timeout_s:g} s (setting call_timeout_s)") from None
                if ack.accepted:
                    return
                if not ack.reason.startswith("busy") or time.monotonic() > deadline:
                    raise SubmissionRefused(f"candidate {candidate.candidate_id} refused: {ack.reason}")
                self.refused_busy += 1
                await asyncio.sleep(backoff)
                backoff = min(1.0, backoff * 2)

    async def updates(self) -> AsyncIterator[CandidateUpdate]:
        self._bind_loop()
        assert self._event is not None
        while True:
            while True:
                with self._lock:
                    if not self._buffer:
                        self._event.clear()
                        break
                    update = self._buffer.popleft()
                yield update
            await self._event.wait()

    async def cancel_job(self, job_id: str) -> None:
        fut = self.client.conn.call(CancelJob(call_id=0, job_id=job_id))
        try:
            await asyncio.wait_for(asyncio.wrap_future(fut), self.settings.call_timeout_s)
        except asyncio.TimeoutError:
            raise CallTimeout(f"cancel of job {job_id} got no answer within "
                              f"{self.settings.call_timeout_s:g} s (setting call_timeout_s)") from None
        except RemoteError as exc:
            if exc.code != "unknown_job":
                raise

    def load(self) -> BackendLoad:
        if not self._load_pending and time.monotonic() - self._load_at > _LOAD_REFRESH_S:
            self._load_pending = True
            self.client.conn.call(GetStats(call_id=0)).add_done_callback(self._on_stats)
        return self._load

    def _on_stats(self, fut) -> None:  # type: ignore[no-untyped-def]
        self._load_pending = False
        self._load_at = time.monotonic()
        if fut.exception() is not None:
            return
        s = fut.result().stats
        self._load = BackendLoad(
            validation_queued=s.validate.queued, profiling_queued=s.profile.queued,
            validation_running=s.validate.running, profiling_running=s.profile.running,
            validation_workers=s.validate.workers, profiling_workers=s.profile.workers)

    async def refresh_load(self) -> BackendLoad:
        """Fetch a fresh snapshot now (load() never waits)."""
        try:
            reply = await asyncio.wait_for(asyncio.wrap_future(self.client.conn.call(GetStats(call_id=0))),
                                           self.settings.call_timeout_s)
        except asyncio.TimeoutError:
            raise CallTimeout(f"no load figures within {self.settings.call_timeout_s:g} s "
                              "(setting call_timeout_s)") from None
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(reply)
        self._on_stats(fut)
        return self._load
