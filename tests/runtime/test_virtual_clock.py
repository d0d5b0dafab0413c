"""The scheduler's core and its elastic pool policy on a virtual clock: every figure comes out
exactly as computed by hand, the same on every run, in no real time."""
from __future__ import annotations

import time

from specgen.clock import VirtualClock
from specgen.messages import (
    AssignWork, CandidateSubmission, CandidateUpdate, Hello, SchedulerStats, SubmitCandidate,
    Verdict, WorkDone,
)
from specgen.runtime.journal import Journal
from specgen.runtime.scheduler_core import SchedulerCore
from specgen.runtime.settings import RuntimeSettings

CLIENT = b"client/c/1"
T0, WALL0 = 1000.0, 5000.0


class Sim:
    """Drives the core as the scheduler actor does, with the time taken from a VirtualClock."""

    def __init__(self, **settings: object) -> None:
        self.clock = VirtualClock(start=T0, wall_start=WALL0)
        self.journal = Journal(":memory:")
        self.core = SchedulerCore(RuntimeSettings(**settings), self.journal,  # type: ignore[arg-type]
                                  scheduler_id="sim", clock=self.clock)
        self.calls = 0
        self.assigned: dict[bytes, tuple[AssignWork, float]] = {}   # worker -> (work, wall at assign)

    def send(self, peer: bytes, msg) -> None:
        now = self.clock.now()
        self.core.handle(peer, msg, now)
        self.core.schedule(now)
        self.journal.commit()
        for to, out in self.core.outbox:
            if isinstance(out, AssignWork):
                self.assigned[to] = (out, self.clock.wall())
        self.core.outbox = []

    def tick(self) -> None:
        self.core.tick(self.clock.now())
        self.core.schedule(self.clock.now())

    def worker(self, name: str) -> bytes:
        peer = f"worker/{name}/x".encode()
        self.send(peer, Hello(role="worker", name=name, node="n1", device="cpu"))
        return peer

    def submit(self, cid: str) -> None:
        self.calls += 1
        sub = CandidateSubmission(job_id="j1", candidate_id=cid, problem_name="p",
                                  problem_source="class Model: pass\n", candidate_source="x",
                                  extracted_at=self.clock.wall())
        self.send(CLIENT, SubmitCandidate(call_id=self.calls, submission=sub))

    def finish(self, worker: bytes, speedup: float = 2.0) -> str:
        work, started = self.assigned.pop(worker)
        self.calls += 1
        v = Verdict(stage=work.stage, compiled=True, correct=True,
                    speedup=speedup if work.stage == "profile" else None)
        upd = CandidateUpdate(job_id="j1", candidate_id=work.submission.candidate_id, stage=work.stage,
                              verdict=v, worker=worker.decode(), started_at=started,
                              finished_at=self.clock.wall())
        self.send(worker, WorkDone(call_id=self.calls, request_id=work.request_id, update=upd))
        return f"{work.submission.candidate_id}/{work.stage}"

    def pools(self) -> dict[str, str]:
        return {w.name: w.pool + (f"->{w.pending_pool}" if w.pending_pool else "")
                for w in self.core.workers.values()}


def run_scenario() -> tuple[Sim, list[SchedulerStats], list[dict[str, str]]]:
    sim = Sim(lend_idle_workers=False, peer_timeout_s=1e9)
    snapshots: list[SchedulerStats] = []
    splits: list[dict[str, str]] = []
    sim.send(CLIENT, Hello(role="client", name="c"))
    w = [sim.worker(f"w{i}") for i in range(4)]
    splits.append(sim.pools())
    # t=1000: a burst of ten candidates; the two validators take the first two.
    for i in range(10):
        sim.submit(f"c{i}")
    # t=1002: both validations end (2 s each); c0 and c1 go on to the profilers, c2 and c3 start.
    sim.clock.advance(2.0)
    assert [sim.finish(w[0]), sim.finish(w[2])] == ["c0/validate", "c1/validate"]
    snapshots.append(sim.core.stats(sim.clock.now()))
    # t=1003: the tick weighs the validation backlog against the profiling load.
    sim.clock.advance(1.0)
    sim.tick()
    snapshots.append(sim.core.stats(sim.clock.now()))
    splits.append(sim.pools())
    # t=1004, t=1005: the profiles end; the marked profiler moves once it has reported.
    sim.clock.advance(1.0)
    assert sim.finish(w[1], speedup=1.5) == "c0/profile"
    splits.append(sim.pools())
    sim.clock.advance(1.0)
    assert sim.finish(w[3], speedup=3.0) == "c1/profile"
    snapshots.append(sim.core.stats(sim.clock.now()))
    return sim, snapshots, splits


def test_elastic_split_and_feedback_latency_on_a_virtual_clock() -> None:
    started = time.monotonic()
    sim, (s1002, s1003, s1005), splits = run_scenario()
    assert time.monotonic() - started < 5.0     # a 5-second scenario; no real sleep in it

    # Workers join with no load measured: the split alternates, 2 and 2.
    assert splits[0] == {"w0": "validate", "w1": "profile", "w2": "validate", "w3": "profile"}

    # t=1002: 10 arrivals over 2 s; service measured 2 s; 6 queued (c2, c3 run).
    v = s1002.validate
    assert (v.arrival_rate, v.service_s, v.queued, v.running) == (10 / 2.0, 2.0, 6, 2)
    assert v.offered_load == 10 / 2.0 * 2.0 + 6 * 2.0 / 5.0
    assert s1002.profile.running == 2 and s1002.profile.service_s == 1.0   # the initial estimate

    # t=1003: validation offers 10/3 * 2 + 6 * 2 / 5 workers of load, profiling 2/1 * 1; the
    # validation pool's share of 4 workers is above 2 + 0.5 + 0.35, so a profiler is moved: both
    # are busy, the one busy longest (w1, by order) is marked and moves when it reports.
    offered_v = 10 / 3.0 * 2.0 + 6 * 2.0 / 5.0
    offered_p = 2 / 1.0 * 1.0 + 0 * 1.0 / 5.0
    assert s1003.validate.offered_load == offered_v
    assert s1003.profile.offered_load == offered_p
    assert 4 * offered_v / (offered_v + offered_p) > 2 + 0.5 + 0.35
    assert splits[1] == {"w0": "validate", "w1": "profile->validate", "w2": "validate", "w3": "profile"}
    assert splits[2] == {"w0": "validate", "w1": "validate", "w2": "validate", "w3": "profile"}
    assert s1005.reassignments == 1

    # Feedback latency: extracted at wall 5000, profiled at 5004 and 5005.
    assert list(sim.core.feedback_latencies) == [4.0, 5.0]
    assert (s1005.feedback_latency_p50_s, s1005.feedback_latency_p95_s) == (5.0, 5.0)
    assert s1005.uptime_s == 5.0
    # Profiling service time: first measurement 2 s (1002 -> 1004), then 0.8 * 2 + 0.2 * 3.
    assert s1005.profile.service_s == 0.8 * 2.0 + 0.2 * 3.0
    # Validation busy time: w0 and w2 busy all 5 s; w1 joins at 1004 and takes c4 at once.
    assert s1005.validate.workers == 3
    busy_v = 2 * 5.0 + 1 * 1.0
    capacity_v = 2 * 5.0 + 1 * 1.0
    assert s1005.validate.utilization == busy_v / capacity_v


def test_a_virtual_run_is_repeatable() -> None:
    _, first, splits1 = run_scenario()
    _, second, splits2 = run_scenario()
    assert first == second and splits1 == splits2
