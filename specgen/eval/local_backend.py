"""`LocalEvaluationBackend`: the optimize loop's evaluation backend inside one process.

Implements `specgen.backend.EvaluationBackend` over a list of `EvalWorker`s with asyncio
and threads: each submission is validated, then (when it validated and asks for it) profiled,
each stage on whichever worker is free, profiling first so that feedback latency stays low. Every
stage finished becomes a `CandidateUpdate`, delivered in completion order. Extensions of queued
candidates are built ahead on CPU threads (`build_slots`) while the workers' devices run others.
`cancel_job` drops the job's queued work (an update with `cancelled=True` each) and cancels what
runs for it. The workers belong to the caller: `close()` stops this backend, not them.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import os
import time
from dataclasses import dataclass
from typing import AsyncIterator

from specgen.backend import BackendLoad
from specgen.eval.evaluator import EvalWorker
from specgen.messages import CandidateSubmission, CandidateUpdate, Verdict


@dataclass
class _Item:
    submission: CandidateSubmission
    stage: str                                  # "validate" | "profile"


class LocalEvaluationBackend:
    def __init__(self, workers: list[EvalWorker], build_slots: int | None = None) -> None:
        if not workers:
            raise ValueError("LocalEvaluationBackend needs at least one EvalWorker")
        self._workers = list(workers)
        self._build_slots = build_slots if build_slots is not None else max(
            1, (os.cpu_count() or 2) // 2)
        self._validate: collections.deque[_Item] = collections.deque()
        self._profile: collections.deque[_Item] = collections.deque()
        self._running: dict[int, _Item] = {}    # worker index -> item it runs
        self._cancelled_jobs: set[str] = set()
        self._updates: asyncio.Queue[CandidateUpdate] | None = None
        self._wakeup: asyncio.Condition | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=len(workers), thread_name_prefix="specgen-eval")
        self._builder = concurrent.futures.ThreadPoolExecutor(
            max_workers=self._build_slots, thread_name_prefix="specgen-build")
        self._closed = False

    # ------------------------------------------------------------------ protocol
    async def submit(self, candidate: CandidateSubmission) -> None:
        self._ensure_started()
        assert self._wakeup is not None
        # New work for a job cancelled earlier means the job wants candidates again.
        self._cancelled_jobs.discard(candidate.job_id)
        if "load_inline" in candidate.candidate_source or \
                "cpp_extension" in candidate.candidate_source:
            # Built on a CPU thread now; the worker that runs it finds the build in the cache.
            self._builder.submit(self._prebuild, candidate)
        async with self._wakeup:
            self._validate.append(_Item(candidate, "validate"))
            self._wakeup.notify_all()

    async def updates(self) -> AsyncIterator[CandidateUpdate]:
        self._ensure_started()
        assert self._updates is not None
        while True:
            yield await self._updates.get()

    async def cancel_job(self, job_id: str) -> None:
        self._ensure_started()
        assert self._wakeup is not None and self._updates is not None
        self._cancelled_jobs.add(job_id)
        dropped: list[_Item] = []
        async with self._wakeup:
            for queue in (self._validate, self._profile):
                keep = [item for item in queue if item.submission.job_id != job_id]
                dropped += [item for item in queue if item.submission.job_id == job_id]
                queue.clear()
                queue.extend(keep)
        for item in dropped:
            await self._updates.put(self._cancelled_update(item, "cancelled: job cancelled"))
        for index, item in list(self._running.items()):
            if item.submission.job_id == job_id:
                self._workers[index].cancel(_run_id(item))

    def load(self) -> BackendLoad:
        running = list(self._running.values())
        count = len(self._workers)
        return BackendLoad(
            validation_queued=len(self._validate), profiling_queued=len(self._profile),
            validation_running=sum(1 for item in running if item.stage == "validate"),
            profiling_running=sum(1 for item in running if item.stage == "profile"),
            validation_workers=count, profiling_workers=count)

    async def close(self) -> None:
        """Stop serving: cancel what runs, drop what is queued; the workers stay up."""
        self._closed = True
        for worker in self._workers:
            worker.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._builder.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ internals
    def _ensure_started(self) -> None:
        if self._closed:
            raise RuntimeError("LocalEvaluationBackend is closed")
        if self._tasks:
            return
        self._updates = asyncio.Queue()
        self._wakeup = asyncio.Condition()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._serve(index), name=f"specgen-eval-{index}")
                       for index in range(len(self._workers))]

    def _prebuild(self, candidate: CandidateSubmission) -> None:
        try:
            self._workers[0].build(candidate)
        except Exception:  # noqa: BLE001 - the run builds (and reports) for itself
            pass

    async def _next(self) -> _Item:
        assert self._wakeup is not None
        async with self._wakeup:
            while not self._profile and not self._validate:
                await self._wakeup.wait()
            return (self._profile or self._validate).popleft()

    async def _serve(self, index: int) -> None:
        assert self._updates is not None and self._wakeup is not None
        worker = self._workers[index]
        loop = asyncio.get_running_loop()
        while True:
            item = await self._next()
            submission = item.submission
            if submission.job_id in self._cancelled_jobs:
                await self._updates.put(self._cancelled_update(item, "cancelled: job cancelled"))
                continue
            if submission.deadline is not None and time.time() > submission.deadline:
                await self._updates.put(self._cancelled_update(item, "cancelled: deadline passed"))
                continue
            self._running[index] = item
            started = time.time()
            try:
                verdict = await loop.run_in_executor(self._executor, worker.run, submission,
                                                     item.stage, _run_id(item))
            except Exception as exc:  # noqa: BLE001 - a worker fault must not end the loop
                verdict = Verdict(stage=item.stage, device=worker.device,
                                  error=f"worker {worker.name} failed: {type(exc).__name__}: {exc}")
            finally:
                self._running.pop(index, None)
            cancelled = verdict.code == "cancelled"
            await self._updates.put(CandidateUpdate(
                job_id=submission.job_id, candidate_id=submission.candidate_id, stage=item.stage,
                verdict=verdict, worker=worker.name, started_at=started, finished_at=time.time(),
                cancelled=cancelled))
            if item.stage == "validate" and verdict.correct and submission.profile and \
                    not cancelled and submission.job_id not in self._cancelled_jobs:
                async with self._wakeup:
                    self._profile.append(_Item(submission, "profile"))
                    self._wakeup.notify_all()

    def _cancelled_update(self, item: _Item, why: str) -> CandidateUpdate:
        now = time.time()
        return CandidateUpdate(
            job_id=item.submission.job_id, candidate_id=item.submission.candidate_id,
            stage=item.stage, verdict=Verdict(stage=item.stage, error=why, code="cancelled"),
            started_at=now, finished_at=now, cancelled=True)


def _run_id(item: _Item) -> str:
    """The id a running item's evaluation carries, so that a cancel never misses it."""
    return f"{item.submission.job_id}/{item.submission.candidate_id}/{item.stage}"
