"""The evaluation interface: what the optimize loop needs from whoever evaluates its candidates.

It sits at the bottom with the messages, so that its implementation (`runtime`'s, over a
scheduler) and the loop that uses it import it without importing each other.

The loop never talks to sockets or subprocesses itself: it submits `CandidateSubmission`s and reads
`CandidateUpdate`s. The runtime's scheduler client implements this, over ZeroMQ (one machine or
many `specgen-node`s) or to a scheduler core in the same process (runtime/inprocess.py).
"""
from __future__ import annotations

from typing import AsyncIterator, Protocol

import msgspec

from specgen.messages import CandidateSubmission, CandidateUpdate


class BackendLoad(msgspec.Struct, kw_only=True):
    """A snapshot of evaluation load, for load-aware fork triggers and the progress display."""

    validation_queued: int = 0
    profiling_queued: int = 0
    validation_running: int = 0
    profiling_running: int = 0
    validation_workers: int = 0
    profiling_workers: int = 0


class EvaluationBackend(Protocol):
    async def submit(self, candidate: CandidateSubmission) -> None:
        """Queue a candidate; its updates arrive later through `updates()`."""

    def updates(self) -> AsyncIterator[CandidateUpdate]:
        """Every update for candidates this backend accepted, in completion order."""

    async def cancel_job(self, job_id: str) -> None:
        """Drop queued work of the job and stop what is running for it."""

    def load(self) -> BackendLoad:
        """Current queue lengths and worker counts (may be slightly stale)."""
