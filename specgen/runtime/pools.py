"""Elastic validation/profiling pools: measure each kind's load, decide the split, meter usage.

Every worker belongs to one pool at a time. The controller measures, per pool, the arrival rate
(requests/s over `rate_window_s`) and the service time (smoothed over finished requests), and
computes the offered load in workers: rate * service time + queued * service time /
`drain_horizon_s` (a backlog must drain within the horizon). The validation pool's target share
of the N workers is its share of the total offered load. A worker moves only when the target is
off by more than half a worker plus `hysteresis_workers`, at most one move per
`rebalance_interval_s`, and never in the middle of a request: a busy worker is marked and moves
when its request ends. With `lend_idle_workers`, an idle worker whose own queue is empty also
takes the head of the other queue (work-conserving), so no worker idles while work waits; the
split then decides whose work comes first when both queues are non-empty.

In "static" mode the split is fixed (`static_validate_workers`) and workers never lend: the
baseline configuration. In either mode a pool left with no worker at all (a single worker) has
its queue served by the other pool's workers (assignment.py), or its work would wait forever.
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass

from specgen.runtime.priority import POOLS
from specgen.runtime.settings import RuntimeSettings


class RateMeter:
    """Arrivals per second over a sliding window."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._times: collections.deque[float] = collections.deque()
        self._started: float | None = None

    def add(self, now: float) -> None:
        if self._started is None:
            self._started = now
        self._times.append(now)

    def rate(self, now: float) -> float:
        cutoff = now - self.window_s
        times = self._times
        while times and times[0] < cutoff:
            times.popleft()
        if self._started is None:
            return 0.0
        span = min(self.window_s, max(now - self._started, 1e-3))
        return len(times) / span


@dataclass
class PoolEstimate:
    rate: float
    service_s: float
    offered: float


class PoolController:
    def __init__(self, settings: RuntimeSettings) -> None:
        self.settings = settings
        self.elastic = settings.pool_mode == "elastic"
        self.rates = {p: RateMeter(settings.rate_window_s) for p in POOLS}
        self.service_s = {p: settings.initial_service_s for p in POOLS}
        self._measured = {p: False for p in POOLS}
        self.last_move = -math.inf

    def record_arrival(self, pool: str, now: float) -> None:
        self.rates[pool].add(now)

    def record_service(self, pool: str, seconds: float) -> None:
        if seconds <= 0:
            return
        if not self._measured[pool]:
            self.service_s[pool] = seconds
            self._measured[pool] = True
        else:
            self.service_s[pool] = 0.8 * self.service_s[pool] + 0.2 * seconds

    def estimate(self, pool: str, now: float, queued: int) -> PoolEstimate:
        rate = self.rates[pool].rate(now)
        service = self.service_s[pool]
        offered = rate * service + queued * service / self.settings.drain_horizon_s
        return PoolEstimate(rate=rate, service_s=service, offered=offered)

    def static_validators(self, workers: int) -> int:
        wanted = self.settings.static_validate_workers
        if wanted is None:
            wanted = (workers + 1) // 2
        return max(0, min(workers, wanted))

    def min_pool(self, workers: int) -> int:
        return min(self.settings.min_pool_workers, workers // 2)

    def target_validators(self, now: float, workers: int, queued: dict[str, int]) -> float | None:
        """Fractional number of workers the validation pool should have (None: no signal)."""
        if workers == 0:
            return None
        offered_v = self.estimate("validate", now, queued["validate"]).offered
        offered_p = self.estimate("profile", now, queued["profile"]).offered
        total = offered_v + offered_p
        if total <= 0:
            return None
        low = self.min_pool(workers)
        return min(max(workers * offered_v / total, low), workers - low)

    def move(self, now: float, workers: int, validators: int, queued: dict[str, int]) -> str | None:
        """Which pool should give up one worker now ("validate" or "profile"), if any."""
        if not self.elastic or now - self.last_move < self.settings.rebalance_interval_s:
            return None
        target = self.target_validators(now, workers, queued)
        if target is None:
            return None
        margin = 0.5 + self.settings.hysteresis_workers
        low = self.min_pool(workers)
        if target > validators + margin and workers - validators > low:
            return "profile"
        if target < validators - margin and validators > low:
            return "validate"
        return None


class UsageMeter:
    """Integrates busy worker-time per pool and busy share while requests wait."""

    def __init__(self, now: float) -> None:
        self.started = now
        self._last = now
        self.busy = {p: 0.0 for p in POOLS}
        self.capacity = {p: 0.0 for p in POOLS}
        self.waiting_time = 0.0
        self.busy_while_waiting = 0.0
        # current piecewise-constant state, set by the scheduler after each change
        self.workers = {p: 0 for p in POOLS}
        self.busy_now = {p: 0 for p in POOLS}
        self.queued_now = 0

    def advance(self, now: float) -> None:
        dt = now - self._last
        if dt <= 0:
            return
        self._last = now
        total_workers = 0
        total_busy = 0
        for p in POOLS:
            self.busy[p] += self.busy_now[p] * dt
            self.capacity[p] += self.workers[p] * dt
            total_workers += self.workers[p]
            total_busy += self.busy_now[p]
        if self.queued_now > 0 and total_workers > 0:
            self.waiting_time += dt
            self.busy_while_waiting += dt * total_busy / total_workers

    def utilization(self, pool: str) -> float:
        cap = self.capacity[pool]
        return self.busy[pool] / cap if cap > 0 else 0.0

    def busy_share_while_waiting(self) -> float | None:
        return self.busy_while_waiting / self.waiting_time if self.waiting_time > 0 else None
