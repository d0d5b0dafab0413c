"""Which queued request a free worker runs next: a configurable rule and a heap per pool.

The rule is an ordered list of criteria (setting `priority_rule`), most significant first. The
default, ["deadline", "final_first", "stage", "oldest"], reads: the earliest deadline first (a
candidate's deadline, else its job's; none sorts last), so jobs closer to their end are served
first; at equal deadlines (e.g. within one job) an iteration's answer before speculative (fork and
inline) candidates, because the answer's verdict is what the loop's next prompt waits for while a
speculative candidate's verdict only may end the iteration early; then profiling of an already
validated candidate before a fresh validation, because profiling feedback is what the optimize
loop waits for and a validated candidate is one step from it; then the oldest extraction first. Putting "own_pool" first instead
makes every worker finish its own pool's queue before it helps the other pool.

Where the rule applies: each pool has its own queue ordered by the rule; an idle worker compares
the head of its own pool's queue with the head of the other pool's queue (when lending, and only
while no worker of that pool is idle) and takes the better one. Requests of jobs that have ended,
and requests past their deadline, are dropped when they reach the head, never run.

Fairness: the criteria up to the first "oldest" or "newest" make a request's priority level (by
default its deadline and stage); within one level the queue serves the requesters round robin,
one request each per round, each requester's own requests in the rule's order. A requester is a
job (all the requests of its reasoner or optimize loop) or, for one-off evaluations (which have
no job), the calling peer. So a client that queued a hundred evaluations delays one that queued
two by at most one evaluation per round, whoever came first; a requester that had nothing queued
joins the current round (it saves no turns while idle). Within a round, requesters go in the
order of their best requests ("oldest": the longest waiting first).
"""
from __future__ import annotations

import bisect
import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, get_args

from specgen.messages import CandidateSubmission, Pool

PRIORITY_CRITERIA: dict[str, str] = {
    "own_pool": "requests of the worker's own pool before the other pool's (matters when lending)",
    "deadline": "earlier deadline first; requests without one last",
    "stage": "profiling (of validated candidates) before validation",
    "oldest": "earlier extraction first (FIFO)",
    "newest": "later extraction first (LIFO)",
    "iteration": "later optimize-loop iteration first",
    "final_first": "final answers before speculative forks",
}

POOLS: tuple[Pool, ...] = get_args(Pool)


def pool_of_stage(stage: str) -> Pool:
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
    progress_interval_s: float = 0.0         # direct requests: how often the caller wants word of it
    removed: bool = field(default=False, repr=False)
    sort_key: tuple = field(default=(), repr=False)
    slot: "_Requester | None" = field(default=None, repr=False)   # where it waits while queued

    @property
    def requester(self) -> bytes | str:
        """Whose turn it takes in the round robin: its job, or the caller of a one-off request."""
        return self.reply_to if self.direct and self.reply_to is not None else self.key[0]

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
        # A queue key's first `level_size` values are the request's priority level; the round robin
        # across requesters applies within a level (see the module's docstring).
        ordered = [c for c in criteria if c != "own_pool"]
        self.level_size = next((i for i, c in enumerate(ordered) if c in ("oldest", "newest")), len(ordered))

    def queue_key(self, req: QueuedRequest) -> tuple:
        return tuple(f(req) for f in self._funcs) + (req.seq,)

    def full_key(self, req: QueuedRequest, worker_pool: str) -> tuple:
        key = req.sort_key or self.queue_key(req)
        if self._own_pool_at is None:
            return key
        own = 0.0 if req.pool == worker_pool else 1.0
        return key[: self._own_pool_at] + (own,) + key[self._own_pool_at:]


_versions = itertools.count(1)   # turn entries' versions: unique, so entries never compare requesters


class _Requester:
    """One requester's queued requests at one priority level, in the rule's order, and its turn."""

    __slots__ = ("name", "level", "waiting", "round", "version")

    def __init__(self, name: bytes | str, level: "_Level", round_: int) -> None:
        self.name = name
        self.level = level
        self.waiting: list[tuple[tuple, QueuedRequest]] = []   # (queue key, request), sorted
        self.round = round_      # the round of its next turn
        self.version = 0         # that of its one current entry in the level's turns


class _Level:
    """The requests of one priority level: their requesters, taking turns."""

    __slots__ = ("key", "requesters", "turns", "round", "live", "active")

    def __init__(self, key: tuple) -> None:
        self.key = key
        self.requesters: dict[bytes | str, _Requester] = {}
        # (round, queue key of its best request, version, requester): the next turn is the top.
        # Entries whose version is not the requester's are stale and skipped.
        self.turns: list[tuple[int, tuple, int, _Requester]] = []
        self.round = 0           # the round of the latest turn served
        self.live = 0            # requests queued
        self.active = 0          # requesters with requests queued

    def queue_turn(self, who: _Requester) -> None:
        """(Re)place the requester's entry: its head changed."""
        who.version = next(_versions)
        heapq.heappush(self.turns, (who.round, who.waiting[0][0], who.version, who))
        if len(self.turns) > 64 and len(self.turns) > 4 * self.active:
            self.turns = [t for t in self.turns if t[2] == t[3].version]
            heapq.heapify(self.turns)

    def top(self) -> _Requester:
        turns = self.turns
        while turns[0][2] != turns[0][3].version:
            heapq.heappop(turns)
        return turns[0][3]

    def emptied(self, who: _Requester) -> None:
        """The requester has nothing queued any more: drop its entry, and its record once the
        record says nothing a newcomer's would not (a requester joins at the current round)."""
        who.version = 0
        self.active -= 1
        if who.round <= self.round:
            del self.requesters[who.name]
        elif len(self.requesters) > 64 and len(self.requesters) > 4 * self.active:
            self.requesters = {k: v for k, v in self.requesters.items() if v.waiting or v.round > self.round}


class RequestQueue:
    """Requests of one pool: levels by priority, requesters round robin within a level.

    push, peek and pop take O(log n) (plus a copy of one requester's pointers), remove too;
    `position` says how many pops a request is from the head."""

    def __init__(self, rule: PriorityRule) -> None:
        self.rule = rule
        self._levels: dict[tuple, _Level] = {}
        self._order: list[tuple[tuple, int, _Level]] = []    # heap of (level key, n, level)
        self._n = itertools.count()
        self._emptied = 0    # levels emptied since their count was last looked at
        self.live = 0        # requests queued and not removed (len() of the queue)

    def __len__(self) -> int:
        return self.live

    def push(self, req: QueuedRequest) -> None:
        req.removed = False
        key = req.sort_key = self.rule.queue_key(req)
        level_key = key[: self.rule.level_size]
        level = self._levels.get(level_key)
        if level is None:
            level = self._levels[level_key] = _Level(level_key)
            heapq.heappush(self._order, (level_key, next(self._n), level))
        requester = req.requester
        who = level.requesters.get(requester)
        if who is None:
            who = level.requesters[requester] = _Requester(requester, level, level.round)
        req.slot = who
        waiting = who.waiting
        entry = (key, req)
        # Back from a lost worker: the turn it took is given back (never one before the others').
        back = req.attempts > 0 and who.round > level.round
        if back:
            who.round -= 1
        if not waiting:
            who.round = max(who.round, level.round)   # no turns saved up while it had nothing queued
            waiting.append(entry)
            level.active += 1
            level.queue_turn(who)
        elif key < waiting[0][0]:
            waiting.insert(0, entry)
            level.queue_turn(who)
        else:
            bisect.insort(waiting, entry)
            if back:
                level.queue_turn(who)
        level.live += 1
        self.live += 1

    def _top_level(self) -> _Level | None:
        order = self._order
        while order:
            level = order[0][2]
            if level.live:
                return level
            heapq.heappop(order)
            if self._levels.get(level.key) is level:
                del self._levels[level.key]
        return None

    def peek(self) -> QueuedRequest | None:
        level = self._top_level()
        if level is None:
            return None
        return level.top().waiting[0][1]

    def pop(self) -> QueuedRequest | None:
        level = self._top_level()
        if level is None:
            return None
        who = level.top()
        req = who.waiting.pop(0)[1]
        level.round = who.round
        who.round += 1
        if who.waiting:
            who.version = next(_versions)
            heapq.heapreplace(level.turns, (who.round, who.waiting[0][0], who.version, who))
        else:
            heapq.heappop(level.turns)
            level.emptied(who)
        req.removed = True
        req.slot = None
        level.live -= 1
        self.live -= 1
        if not level.live:
            self._level_emptied()
        return req

    def remove(self, req: QueuedRequest) -> None:
        if req.removed:
            return
        who = req.slot
        assert who is not None
        waiting = who.waiting
        i = bisect.bisect_left(waiting, (req.sort_key,))
        assert waiting[i][1] is req
        del waiting[i]
        req.removed = True
        req.slot = None
        level = who.level
        level.live -= 1
        self.live -= 1
        if not waiting:
            level.emptied(who)
            if not level.live:
                self._level_emptied()
        elif i == 0:
            level.queue_turn(who)

    def _level_emptied(self) -> None:
        """Forget empty levels once they are most of them (distinct deadlines come and go); the
        count is looked at after as many levels emptied as there are, so it costs O(1) a pop."""
        self._emptied += 1
        if self._emptied < 64 or self._emptied < len(self._levels):
            return
        self._emptied = 0
        if 2 * sum(1 for level in self._levels.values() if level.live) < len(self._levels):
            self._levels = {k: v for k, v in self._levels.items() if v.live}
            self._order = [e for e in self._order if self._levels.get(e[0]) is e[2]]
            heapq.heapify(self._order)

    def position(self, req: QueuedRequest) -> int:
        """How many pops until `req` comes out (1: it is the head), if nothing else arrives: every
        request of a better level, and within its own level the turns that come before its own."""
        who = req.slot
        if req.removed or who is None:
            return 0
        level = who.level
        ahead = sum(other.live for other in self._levels.values() if other.key < level.key)
        key = req.sort_key
        rank = bisect.bisect_left(who.waiting, (key,))
        turn = who.round + rank    # the round in which `req` is served
        for other in level.requesters.values():
            if other is who or not other.waiting:
                continue
            n = len(other.waiting)
            before = turn - other.round          # its turns in earlier rounds
            if before > 0:
                ahead += min(before, n)
            if 0 <= before < n and other.waiting[before][0] < key:
                ahead += 1                       # same round, a better request
        return ahead + rank + 1

    def items(self) -> list[QueuedRequest]:
        return [req for level in self._levels.values() for who in level.requesters.values()
                for _, req in who.waiting]
