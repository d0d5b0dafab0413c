"""Which queued request a free worker runs next: a configurable rule and a heap per pool.

The rule is an ordered list of criteria (setting `priority_rule`), most significant first. The
default, ["deadline", "stage", "oldest"], reads: the earliest deadline first (a candidate's
deadline, else its job's; none sorts last), so jobs closer to their end are served first; at equal
deadlines (e.g. within one job) profiling of an already validated candidate before a fresh
validation, because profiling feedback is what the optimize loop waits for and a validated
candidate is one step from it; then the oldest extraction first. Putting "own_pool" first instead
makes every worker finish its own pool's queue before it helps the other pool.

Where the rule applies: each pool has its own queue ordered by the rule; an idle worker compares
the head of its own pool's queue with the head of the other pool's queue (when lending, and only
while no worker of that pool is idle) and takes the better one. Requests of jobs that have ended,
and requests past their deadline, are dropped when they reach the head, never run.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable

from specgen.messages import CandidateSubmission

PRIORITY_CRITERIA: dict[str, str] = {
    "own_pool": "requests of the worker's own pool before the other pool's (matters when lending)",
    "deadline": "earlier deadline first; requests without one last",
    "stage": "profiling (of validated candidates) before validation",
    "oldest": "earlier extraction first (FIFO)",
    "newest": "later extraction first (LIFO)",
    "iteration": "later optimize-loop iteration first",
    "final_first": "final answers before speculative forks",
}

POOLS = ("validate", "profile")


def pool_of_stage(stage: str) -> str:
    """Validation runs in the validation pool; anything that times kernels in the profiling pool."""
    return "validate" if stage == "validate" else "profile"


@dataclass(eq=False, slots=True)
class QueuedRequest:
    """One stage of one candidate, waiting or running."""

    key: tuple[str, str, str]                # (job_id, candidate_id, stage): dedupe key
    stage: str
    submission: CandidateSubmission
    seq: int                                 # arrival order, the final tie-break
    deadline: float = math.inf               # wall clock; inf = none
    reply_to: bytes | None = None            # direct requests: the caller
    call_id: int = 0                         # direct requests: the caller's call id
    direct: bool = False
    attempts: int = 0                        # workers lost while running it
    enqueued_at: float = 0.0                 # monotonic
    request_id: str = ""                     # current attempt's id (set when assigned)
    started_at: float = 0.0                  # wall clock of the current attempt
    orphan: bool = False                     # running on a worker, unknown to this scheduler
    removed: bool = field(default=False, repr=False)
    sort_key: tuple = field(default=(), repr=False)

    @property
    def pool(self) -> str:
        return pool_of_stage(self.stage)


_CRITERION_VALUE: dict[str, Callable[[QueuedRequest], float]] = {
    "deadline": lambda r: r.deadline,
    "stage": lambda r: 1.0 if r.stage == "validate" else 0.0,
    "oldest": lambda r: r.submission.extracted_at,
    "newest": lambda r: -r.submission.extracted_at,
    "iteration": lambda r: -float(r.submission.iteration),
    "final_first": lambda r: 0.0 if r.submission.origin == "final" else 1.0,
}


class PriorityRule:
    def __init__(self, criteria: list[str]) -> None:
        unknown = [c for c in criteria if c not in PRIORITY_CRITERIA]
        if unknown:
            raise ValueError(f"unknown priority criteria {unknown}; known: {sorted(PRIORITY_CRITERIA)}")
        self.criteria = list(criteria)
        # own_pool is constant inside one pool's queue, so the heaps order by the other criteria
        # and own_pool only decides between the heads of the two queues.
        self._funcs = [_CRITERION_VALUE[c] for c in criteria if c != "own_pool"]
        self._own_pool_at = criteria.index("own_pool") if "own_pool" in criteria else None

    def queue_key(self, req: QueuedRequest) -> tuple:
        return tuple(f(req) for f in self._funcs) + (req.seq,)

    def full_key(self, req: QueuedRequest, worker_pool: str) -> tuple:
        key = req.sort_key or self.queue_key(req)
        if self._own_pool_at is None:
            return key
        own = 0.0 if req.pool == worker_pool else 1.0
        return key[: self._own_pool_at] + (own,) + key[self._own_pool_at:]


class RequestQueue:
    """A heap with lazy removal: push, peek and pop in O(log n), remove in O(1)."""

    def __init__(self, rule: PriorityRule) -> None:
        self.rule = rule
        self._heap: list[tuple[tuple, int, QueuedRequest]] = []
        self.live = 0        # requests queued and not removed (len() of the queue)

    def __len__(self) -> int:
        return self.live

    def push(self, req: QueuedRequest) -> None:
        req.removed = False
        req.sort_key = self.rule.queue_key(req)
        heapq.heappush(self._heap, (req.sort_key, req.seq, req))
        self.live += 1

    def _prune(self) -> None:
        heap = self._heap
        while heap and heap[0][2].removed:
            heapq.heappop(heap)

    def peek(self) -> QueuedRequest | None:
        self._prune()
        return self._heap[0][2] if self._heap else None

    def pop(self) -> QueuedRequest | None:
        self._prune()
        if not self._heap:
            return None
        req = heapq.heappop(self._heap)[2]
        req.removed = True
        self.live -= 1
        return req

    def remove(self, req: QueuedRequest) -> None:
        if not req.removed:
            req.removed = True
            self.live -= 1
            if len(self._heap) > 64 and self.live < len(self._heap) // 4:
                self._heap = [e for e in self._heap if not e[2].removed]
                heapq.heapify(self._heap)

    def items(self) -> list[QueuedRequest]:
        return [e[2] for e in self._heap if not e[2].removed]
