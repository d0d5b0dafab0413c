"""The scheduler's logic without sockets: peers are byte ids, the clock is the test's."""
from __future__ import annotations

import msgspec
import pytest

from specgen.messages import (
    Ack, AssignWork, CancelJob, CancelWork, CandidateSubmission, CandidateUpdate,
    CandidateUpdateNotice, CreateJob, ErrorReply, EvaluateReply, EvaluateRequest, GetJob, GetStats,
    Heartbeat, HeartbeatAck, Hello, JobCreated, JobEventNotice, JobSpec, JobStatusReply, ReportJobResult, JobResult,
    ResyncUpdates, SubmitAck, SubmitCandidate, SubscribeJob, Verdict, Welcome, WorkDone, WorkerExited,
)
from specgen.runtime.auth import peer_credential, reasoner_credential
from specgen.runtime.journal import Journal
from specgen.runtime.scheduler_core import SchedulerCore
from specgen.runtime.settings import RuntimeSettings

PROBLEM = "class Model:\n    pass\n"
CLIENT = b"client/c/1"


class Harness:
    def __init__(self, journal: Journal | None = None, **settings: object) -> None:
        self.settings = RuntimeSettings(**settings)  # type: ignore[arg-type]
        self.journal = journal or Journal(":memory:")
        self.now = 1000.0
        self.wall = 5000.0
        self.core = SchedulerCore(self.settings, self.journal, wall=lambda: self.wall, now=self.now)
        self.calls = 0

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall += seconds

    def send(self, peer: bytes, msg) -> list:
        self.core.handle(peer, msg, self.now)
        self.core.schedule(self.now)
        self.journal.commit()
        out, self.core.outbox = self.core.outbox, []
        return out

    def call_id(self) -> int:
        self.calls += 1
        return self.calls

    def hello(self, peer: bytes, role: str, name: str, **kw) -> list:
        return self.send(peer, Hello(role=role, name=name, **kw))

    def worker(self, name: str) -> bytes:
        peer = f"worker/{name}/x".encode()
        out = self.hello(peer, "worker", name, node="n1", device="cpu")
        assert any(isinstance(m, Welcome) for _, m in out)
        return peer

    def submit(self, cid: str, job: str = "j1", peer: bytes = CLIENT, **kw) -> list:
        sub = CandidateSubmission(job_id=job, candidate_id=cid, problem_name="p", problem_source=PROBLEM,
                                  candidate_source="x", extracted_at=kw.pop("extracted_at", self.wall), **kw)
        return self.send(peer, SubmitCandidate(call_id=self.call_id(), submission=sub))

    def finish(self, worker: bytes, assign: AssignWork, correct: bool = True, speedup: float = 2.0) -> list:
        sub = assign.submission
        v = Verdict(stage=assign.stage, compiled=True, correct=correct,
                    speedup=speedup if assign.stage != "validate" and correct else None)
        upd = CandidateUpdate(job_id=sub.job_id, candidate_id=sub.candidate_id, stage=assign.stage,
                              verdict=v, worker=worker.decode(), started_at=self.wall - 1, finished_at=self.wall)
        return self.send(worker, WorkDone(call_id=self.call_id(), request_id=assign.request_id, update=upd))


def assigns(out: list, peer: bytes | None = None) -> list[AssignWork]:
    return [m for p, m in out if isinstance(m, AssignWork) and (peer is None or p == peer)]


def updates(out: list) -> list[CandidateUpdate]:
    return [m.update for _, m in out if isinstance(m, CandidateUpdateNotice)]


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.hello(CLIENT, "client", "c")
    return harness


def test_candidate_goes_validate_then_profile_and_updates_reach_the_submitter(h: Harness) -> None:
    w1, w2 = h.worker("n1/cpu0"), h.worker("n1/cpu1")
    pools = {w.name: w.pool for w in h.core.workers.values()}
    assert sorted(pools.values()) == ["profile", "validate"]
    validator = w1 if pools["n1/cpu0"] == "validate" else w2
    profiler = w2 if validator == w1 else w1
    out = h.submit("c1")
    assert any(isinstance(m, SubmitAck) and m.accepted for _, m in out)
    [a] = assigns(out, validator)
    assert a.stage == "validate"
    out = h.finish(validator, a)
    assert [u.stage for u in updates(out)] == ["validate"]
    [p] = assigns(out, profiler)
    assert p.stage == "profile" and p.submission.candidate_id == "c1"
    out = h.finish(profiler, p, speedup=3.0)
    [u] = updates(out)
    assert u.stage == "profile" and u.verdict.speedup == 3.0
    stats = h.core.stats(h.now)
    assert stats.requests_done == 2 and stats.feedback_latency_p50_s is not None


def test_incorrect_candidate_is_not_profiled(h: Harness) -> None:
    w = h.worker("n1/cpu0")
    [a] = assigns(h.submit("bad"))
    out = h.finish(w, a, correct=False)
    assert not assigns(out) and h.core.assigner.total_queued() == 0


def test_a_result_is_acked_in_the_workers_next_assignment_without_a_message_of_its_own(h: Harness) -> None:
    w = h.worker("n1/cpu0")
    [a] = assigns(h.submit("c1", profile=False))
    h.submit("c2", profile=False)
    out = h.finish(w, a)
    assert not [m for p, m in out if p == w and isinstance(m, Ack)]
    [nxt] = assigns(out)
    assert nxt.acked == [h.calls]    # the WorkDone just sent
    [hb] = [m for _, m in h.send(w, Heartbeat()) if isinstance(m, HeartbeatAck)]
    assert hb.acked == []            # acked once


def test_resubmitting_a_known_candidate_queues_nothing_and_replays_its_verdicts(h: Harness) -> None:
    w = h.worker("n1/cpu0")
    [a] = assigns(h.submit("c1", profile=False))
    h.finish(w, a)
    out = h.submit("c1", profile=False)
    ack = [m for _, m in out if isinstance(m, SubmitAck)][0]
    assert ack.duplicate and not assigns(out)
    assert [u.candidate_id for u in updates(out)] == ["c1"]


def test_silent_worker_is_declared_lost_after_the_peer_timeout(h: Harness) -> None:
    w1 = h.worker("n1/cpu0")
    [a] = assigns(h.submit("c1", profile=False))
    w2 = h.worker("n2/cpu0")
    h.advance(h.settings.peer_timeout_s / 2)
    h.send(w2, Heartbeat())
    h.send(CLIENT, Heartbeat())
    h.advance(h.settings.peer_timeout_s / 2 + 0.1)
    h.core.tick(h.now)
    h.core.schedule(h.now)
    [again] = assigns(h.core.outbox, w2)
    assert again.submission.candidate_id == "c1"
    assert w1 not in h.core.workers


def test_cancel_drops_queued_and_stops_running_work(h: Harness) -> None:
    w = h.worker("n1/cpu0")
    out = h.submit("c1")
    [a] = assigns(out)
    h.submit("c2")
    h.submit("c3")
    out = h.send(CLIENT, CancelJob(call_id=h.call_id(), job_id="j1"))
    ack = [m for _, m in out if isinstance(m, Ack)][0]
    assert ack.count == 3
    assert [m.request_id for _, m in out if isinstance(m, CancelWork)] == [a.request_id]
    dropped = updates(out)
    assert sorted(u.candidate_id for u in dropped) == ["c1", "c2", "c3"]
    assert all(u.cancelled and u.verdict.code == "cancelled" for u in dropped)
    # The stopped one answers later: ignored, the worker is free, nothing new is assigned.
    assert h.core.workers[w].busy is not None          # never taken away mid-request
    v = Verdict(stage="validate", error="cancelled")
    out = h.send(w, WorkDone(call_id=h.call_id(), request_id=a.request_id, update=CandidateUpdate(
        job_id="j1", candidate_id="c1", stage="validate", verdict=v, cancelled=True)))
    assert not assigns(out) and not updates(out) and h.core.assigner.total_queued() == 0
    assert h.core.workers[w].busy is None


def test_submissions_past_the_deadline_are_dropped_before_running(h: Harness) -> None:
    h.submit("late", deadline=h.wall + 1.0, profile=False)
    h.advance(2.0)
    out = h.hello(b"worker/n1/cpu0/x", "worker", "n1/cpu0")
    assert not assigns(out)
    [u] = updates(out)
    assert u.cancelled and "deadline" in (u.verdict.error or "")


def test_queue_limit_refuses_with_the_setting_named() -> None:
    h = Harness(max_queued_requests=2)
    h.hello(CLIENT, "client", "c")
    h.submit("a")
    h.submit("b")
    [ack] = [m for _, m in h.submit("c") if isinstance(m, SubmitAck)]
    assert not ack.accepted and "max_queued_requests" in ack.reason


def test_unregistered_and_unexpected_messages_get_errors(h: Harness) -> None:
    [(_, err)] = h.send(b"stranger", Heartbeat())
    assert isinstance(err, ErrorReply) and err.code == "unregistered"
    upd = CandidateUpdate(job_id="j", candidate_id="c", stage="validate", verdict=Verdict())
    [(_, err)] = h.send(CLIENT, WorkDone(call_id=7, request_id="r", update=upd))
    assert isinstance(err, ErrorReply) and err.code == "unexpected" and err.ref == 7
    [(_, err)] = h.send(b"x", Hello(role="wizard", name="x"))
    assert err.code == "bad_role"
    [(_, err)] = h.send(b"x", Hello(role="client", name="x", protocol_version=99))
    assert err.code == "version"


def test_direct_evaluation_replies_to_the_caller(h: Harness) -> None:
    w = h.worker("n1/cpu0")
    sub = CandidateSubmission(job_id="", candidate_id="d", problem_name="p", problem_source=PROBLEM,
                              candidate_source="x")
    out = h.send(CLIENT, EvaluateRequest(call_id=41, submission=sub, stage="full"))
    [a] = assigns(out)
    assert a.stage == "full"
    out = h.finish(w, a)
    [reply] = [m for p, m in out if isinstance(m, EvaluateReply) and p == CLIENT]
    assert reply.call_id == 41 and reply.update.verdict.correct


def _drain_order(h: Harness, w: bytes, first: AssignWork) -> list[tuple[str, str]]:
    order = []
    current = first
    while current is not None:
        order.append((current.submission.candidate_id, current.stage))
        out = h.finish(w, current, correct=current.submission.candidate_id.endswith("ok"))
        nxt = assigns(out, w)
        current = nxt[0] if nxt else None
    return order


def test_priority_deadline_first_then_profiling_then_oldest() -> None:
    h = Harness(priority_rule=["deadline", "stage", "oldest"])
    h.hello(CLIENT, "client", "c")
    w = h.worker("n1/cpu0")
    [blocker] = assigns(h.submit("blocker", job="z", profile=False))
    h.submit("a1-ok", job="A", deadline=h.wall + 200, extracted_at=1.0)
    h.submit("b1-ok", job="B", deadline=h.wall + 100, extracted_at=2.0)
    h.submit("b2-bad", job="B", deadline=h.wall + 100, extracted_at=3.0)
    h.submit("a2-bad", job="A", deadline=h.wall + 200, extracted_at=0.5)
    order = _drain_order(h, w, blocker)
    assert order == [
        ("blocker", "validate"),
        ("b1-ok", "validate"),
        ("b1-ok", "profile"),      # the validated candidate's profiling before B's next validation
        ("b2-bad", "validate"),
        ("a2-bad", "validate"),    # then job A, oldest extraction first
        ("a1-ok", "validate"),
        ("a1-ok", "profile"),
    ]


def test_default_rule_profiles_a_validated_candidate_before_fresh_validations(h: Harness) -> None:
    w = h.worker("n1/cpu0")            # the only worker: validation pool, lends to profiling
    assert h.core.workers[w].pool == "validate"
    [blocker] = assigns(h.submit("x-ok", extracted_at=1.0))
    h.submit("y-bad", extracted_at=2.0)
    order = _drain_order(h, w, blocker)
    assert order == [("x-ok", "validate"), ("x-ok", "profile"), ("y-bad", "validate")]


def test_own_pool_first_keeps_a_worker_on_its_own_queue() -> None:
    h = Harness(priority_rule=["own_pool", "deadline", "stage", "oldest"])
    h.hello(CLIENT, "client", "c")
    w = h.worker("n1/cpu0")
    [blocker] = assigns(h.submit("x-ok", extracted_at=1.0))
    h.submit("y-bad", extracted_at=2.0)
    order = _drain_order(h, w, blocker)
    assert order == [("x-ok", "validate"), ("y-bad", "validate"), ("x-ok", "profile")]


def test_static_pools_never_lend() -> None:
    h = Harness(pool_mode="static", static_validate_workers=1)
    h.hello(CLIENT, "client", "c")
    v, p = h.worker("n1/cpu0"), h.worker("n1/cpu1")
    assert h.core.workers[v].pool == "validate" and h.core.workers[p].pool == "profile"
    [a] = assigns(h.submit("c1", profile=False))
    out = h.submit("c2", profile=False)
    assert not assigns(out)   # the profiler stays idle although validation work waits
    assert h.core.workers[p].busy is None


def test_a_single_static_worker_serves_both_stages() -> None:
    # One worker, split statically, is a validator: the profiling work must still reach it.
    h = Harness(pool_mode="static")
    h.hello(CLIENT, "client", "c")
    w = h.worker("n1/cpu0")
    assert h.core.workers[w].pool == "validate"
    [blocker] = assigns(h.submit("x-ok", extracted_at=1.0))
    assert _drain_order(h, w, blocker) == [("x-ok", "validate"), ("x-ok", "profile")]


def _pool_sizes(h: Harness) -> dict[str, int]:
    sizes = {"validate": 0, "profile": 0}
    for w in h.core.workers.values():
        sizes[w.future_pool] += 1
    return sizes


def test_elastic_pools_follow_a_changing_arrival_mix_with_hysteresis() -> None:
    h = Harness(rebalance_interval_s=0.5, rate_window_s=5.0, lend_idle_workers=False, peer_timeout_s=1e6)
    h.hello(CLIENT, "client", "c")
    peers = [h.worker(f"n1/cpu{i}") for i in range(4)]
    assert _pool_sizes(h) == {"validate": 2, "profile": 2}

    def run_phase(correct: bool, validate_s: float, profile_s: float, seconds: float, tag: str) -> None:
        n = 0
        t_end = h.now + seconds
        while h.now < t_end:
            h.submit(f"{tag}{n}-{'ok' if correct else 'bad'}")
            n += 1
            for w in peers:
                st = h.core.workers[w]
                if st.busy is not None:
                    need = validate_s if st.busy.stage == "validate" else profile_s
                    if h.now - st.busy_since >= need:
                        assign = AssignWork(request_id=st.busy.request_id, stage=st.busy.stage,
                                            submission=st.busy.submission)
                        h.finish(w, assign, correct=correct)
            h.advance(0.05)
            h.core.tick(h.now)
            h.core.schedule(h.now)
            h.core.outbox.clear()

    # Only validations (every candidate fails): the validation pool takes all but one worker.
    run_phase(correct=False, validate_s=0.15, profile_s=0.0, seconds=6.0, tag="v")
    assert _pool_sizes(h) == {"validate": 3, "profile": 1}
    moves = h.core.stats(h.now).reassignments
    # Steady load: hysteresis keeps the split still.
    run_phase(correct=False, validate_s=0.15, profile_s=0.0, seconds=3.0, tag="w")
    assert h.core.stats(h.now).reassignments == moves
    # Every candidate validates fast and profiles slowly: workers move to profiling.
    run_phase(correct=True, validate_s=0.02, profile_s=0.5, seconds=8.0, tag="p")
    assert _pool_sizes(h)["profile"] >= 3
    # Never in the middle of a request: every move happened while idle or was deferred.
    for st in h.core.workers.values():
        assert st.pending_pool is None or st.busy is not None


def test_job_lifecycle_with_reasoner_and_subscribers(h: Harness) -> None:
    out = h.send(CLIENT, CreateJob(call_id=h.call_id(), spec=JobSpec(problem_source=PROBLEM, job_id="J",
                                                                      wall_time_s=60)))
    assert h.core.actions == [("start_reasoner", "J")]
    h.core.actions.clear()
    reasoner = b"reasoner/J/x"
    out = h.send(reasoner, Hello(role="reasoner", name="J"))
    assert any(isinstance(m, JobEventNotice) and m.event.kind == "reasoner_started" for p, m in out if p == CLIENT)
    w = h.worker("n1/cpu0")
    [a] = assigns(h.submit("c1", job="J", peer=reasoner, profile=False))
    assert a.submission.deadline is None and h.core.book.jobs["J"].live
    out = h.finish(w, a)
    assert [u.candidate_id for u in updates(out)] == ["c1"]
    out = h.send(reasoner, ReportJobResult(call_id=h.call_id(), result=JobResult(job_id="J", status="succeeded")))
    assert ("stop_reasoner", "J") in h.core.actions
    finished = [m.event for p, m in out if isinstance(m, JobEventNotice) and p == CLIENT]
    assert finished[-1].kind == "finished" and finished[-1].data["status"] == "succeeded"
    # Late submissions to an ended job are refused; its status comes from the journal.
    [ack] = [m for _, m in h.submit("c2", job="J", peer=reasoner) if isinstance(m, SubmitAck)]
    assert not ack.accepted and "ended" in ack.reason
    [(_, st)] = h.send(CLIENT, GetJob(call_id=h.call_id(), job_id="J"))
    assert isinstance(st, JobStatusReply) and st.status.state == "finished" and st.status.updates == 1
    # A late subscriber gets the whole history from the journal.
    out = h.send(CLIENT, SubscribeJob(call_id=h.call_id(), job_id="J"))
    kinds = [m.event.kind for _, m in out if isinstance(m, JobEventNotice)]
    assert kinds[0] == "created" and kinds[-1] == "finished" and "verdict" in kinds


def test_job_wall_time_is_enforced_after_the_grace(h: Harness) -> None:
    h.send(CLIENT, CreateJob(call_id=h.call_id(), spec=JobSpec(problem_source=PROBLEM, job_id="T", wall_time_s=10)))
    h.send(b"reasoner/T/x", Hello(role="reasoner", name="T"))
    h.advance(10 + h.settings.job_grace_s + 1)
    h.core.tick(h.now)
    assert h.core.views.job_status("T").result.status == "timed_out"
    assert "job_grace_s" in h.core.views.job_status("T").result.error


def test_reasoner_that_never_registers_fails_the_job_naming_the_setting(h: Harness) -> None:
    h.send(CLIENT, CreateJob(call_id=h.call_id(), spec=JobSpec(problem_source=PROBLEM, job_id="R")))
    h.core.book.jobs["R"].reasoner_started = h.now
    h.advance(h.settings.ready_timeout_s + 1)
    h.core.tick(h.now)
    result = h.core.views.job_status("R").result
    assert result.status == "failed" and "ready_timeout_s" in result.error


def test_a_dead_reasoner_is_started_again_up_to_the_setting_then_fails_the_job() -> None:
    h = Harness(reasoner_max_restarts=2)
    h.hello(CLIENT, "client", "c")
    h.send(CLIENT, CreateJob(call_id=h.call_id(), spec=JobSpec(problem_source=PROBLEM, job_id="D")))
    h.core.actions.clear()
    for death in (1, 2):
        h.send(f"reasoner/D/{death}".encode(), Hello(role="reasoner", name="D"))
        h.core.reasoner_exited("D", -9, "killed", h.now)
        assert h.core.actions == [("start_reasoner", "D")] and h.core.views.job_status("D").state == "running"
        h.core.actions.clear()
    assert h.core.views.job_status("D").attempts == 3
    h.core.reasoner_exited("D", -9, "killed", h.now)
    result = h.core.views.job_status("D").result
    assert result.status == "failed" and "reasoner_max_restarts" in result.error
    assert ("stop_reasoner", "D") in h.core.actions


def test_restart_resumes_jobs_from_the_journal_without_losing_or_repeating(tmp_path) -> None:
    path = tmp_path / "journal.sqlite3"
    h = Harness(Journal(path))
    h.hello(CLIENT, "client", "c")
    h.send(CLIENT, CreateJob(call_id=h.call_id(), spec=JobSpec(problem_source=PROBLEM, job_id="J")))
    reasoner = b"reasoner/J/1"
    h.send(reasoner, Hello(role="reasoner", name="J"))
    w = h.worker("n1/cpu0")
    [a] = assigns(h.submit("c1", job="J", peer=reasoner))
    out = h.finish(w, a)                       # validated; its profiling is now queued or running
    p = assigns(out)[0]
    h.submit("c2", job="J", peer=reasoner)     # queued behind
    h.journal.close()

    # A new scheduler process on the same journal.
    h2 = Harness(Journal(path))
    assert h2.core.actions == [("start_reasoner", "J")]
    assert h2.core.book.jobs["J"].attempts == 2
    queued = sorted((r.key[1], r.stage) for q in h2.core.assigner.queues.values() for r in q.items())
    assert queued == [("c1", "profile"), ("c2", "validate")]
    # The old worker was still profiling c1: it says so on Hello and keeps it (nothing runs twice).
    w_again = b"worker/n1/cpu0/x"
    h2.send(w_again, Hello(role="worker", name="n1/cpu0", node="n1", busy_request_id=p.request_id,
                           busy_key=["J", "c1", "profile"]))
    queued = sorted((r.key[1], r.stage) for q in h2.core.assigner.queues.values() for r in q.items())
    assert queued == [("c2", "validate")]
    # The resumed reasoner submits c1 again: answered from the journal, not evaluated again.
    r2 = b"reasoner/J/2"
    h2.send(r2, Hello(role="reasoner", name="J"))
    out = h2.submit("c1", job="J", peer=r2)
    assert [(u.candidate_id, u.stage) for u in updates(out)] == [("c1", "validate")]
    out = h2.finish(w_again, p)
    assert [(u.candidate_id, u.stage) for u in updates(out)] == [("c1", "profile")]
    status = h2.core.views.job_status("J")
    assert status.updates == 2 and status.candidates == 2


# -- who may register -------------------------------------------------------------------------

SECRET = bytes(range(32))


@pytest.fixture
def hs() -> Harness:
    """A core that asks workers, nodes and reasoners for credentials (as the scheduler process does)."""
    harness = Harness()
    harness.core.registry.join_secret = SECRET
    harness.hello(CLIENT, "client", "c")
    return harness


def _worker_hello(name: str, node: str = "n1", secret: bytes = SECRET, **kw) -> Hello:
    return Hello(role="worker", name=name, node=node, device="cpu",
                 credential=peer_credential(secret, "worker", name, node), **kw)


def test_registering_as_worker_node_or_reasoner_takes_a_credential(hs: Harness) -> None:
    hs.send(CLIENT, CreateJob(call_id=hs.call_id(), spec=JobSpec(problem_source=PROBLEM, job_id="J")))
    attempts = [
        Hello(role="worker", name="n1/cpu0", node="n1"),                                  # none
        Hello(role="worker", name="n1/cpu0", node="n1", credential="0" * 64),             # made up
        _worker_hello("n1/cpu0", secret=b"another cluster's secret!!"),                   # other secret
        Hello(role="worker", name="n1/cpu0", node="n1",
              credential=peer_credential(SECRET, "worker", "n1/cpu1", "n1")),           # another's
        Hello(role="worker", name="n1/cpu0", node="n2",
              credential=peer_credential(SECRET, "worker", "n1/cpu0", "n1")),           # another node
        Hello(role="worker", name="n1/cpu0", node="n1",
              credential=peer_credential(SECRET, "node", "n1/cpu0")),                   # another role
        Hello(role="node", name="n1"),
        Hello(role="reasoner", name="J"),
        Hello(role="reasoner", name="J", credential=reasoner_credential(SECRET, "K", 1)),  # another job's
        Hello(role="reasoner", name="J", credential=peer_credential(SECRET, "reasoner", "J")),  # no start
        Hello(role="reasoner", name="gone"),                                              # no such job
    ]
    for i, hello in enumerate(attempts):
        [(_, err)] = hs.send(f"intruder/{i}".encode(), hello)
        assert isinstance(err, ErrorReply) and err.code == "unauthorized", hello
        assert "join secret" in err.message
    assert not hs.core.workers and hs.core.book.jobs["J"].reasoner_peer is None
    assert {p.role for p in hs.core.registry.peers.values()} == {"client"}
    assert hs.core.stats(hs.now).hellos_refused == len(attempts)
    # The right credentials are welcome.
    for peer, hello in ((b"w", _worker_hello("n1/cpu0")),
                        (b"n", Hello(role="node", name="n1", credential=peer_credential(SECRET, "node", "n1"))),
                        (b"r", Hello(role="reasoner", name="J", credential=reasoner_credential(SECRET, "J", 1)))):
        assert any(isinstance(m, Welcome) for _, m in hs.send(peer, hello))
    assert len(hs.core.workers) == 1 and hs.core.book.jobs["J"].reasoner_peer == b"r"


def test_only_the_latest_start_of_a_jobs_reasoner_registers(hs: Harness) -> None:
    # A reasoner of an earlier start (one still exiting when the next was started, after its
    # death or a scheduler restart) would otherwise become the job's reasoner again, and the
    # messages of the latest one would be dropped as a stale reasoner's.
    hs.send(CLIENT, CreateJob(call_id=hs.call_id(), spec=JobSpec(problem_source=PROBLEM, job_id="J")))
    first = Hello(role="reasoner", name="J", credential=reasoner_credential(SECRET, "J", 1))
    assert any(isinstance(m, Welcome) for _, m in hs.send(b"r1", first))
    hs.core.reasoner_exited("J", 1, "killed", hs.now)
    assert hs.core.reasoner_start("J") == 2
    second = Hello(role="reasoner", name="J", credential=reasoner_credential(SECRET, "J", 2))
    assert any(isinstance(m, Welcome) for _, m in hs.send(b"r2", second))
    [(_, err)] = hs.send(b"r1-again", first)
    assert isinstance(err, ErrorReply) and err.code == "stale_reasoner"
    assert err.message == "reasoner of start 1 of job 'J': the job's reasoner is now start 2"
    assert hs.core.book.jobs["J"].reasoner_peer == b"r2"
    assert hs.core.counters["stale_reasoners_refused"] == 1
    [(_, err)] = hs.send(b"r3", Hello(role="reasoner", name="J", credential=reasoner_credential(SECRET, "J", 3)))
    assert err.code == "unauthorized"            # a start the scheduler has not made


def test_a_client_cannot_become_a_worker_or_send_worker_and_node_messages(hs: Harness) -> None:
    [a] = assigns(hs.submit("c1", profile=False) + hs.send(b"w", _worker_hello("n1/cpu0")))
    [(_, err)] = hs.send(CLIENT, Hello(role="worker", name="n1/cpu9", node="n1"))
    assert err.code == "unauthorized" and hs.core.registry.peers[CLIENT].role == "client"
    for msg in (WorkDone(call_id=5, request_id=a.request_id, update=CandidateUpdate(
                    job_id="j1", candidate_id="c1", stage="validate", verdict=Verdict(correct=True))),
                WorkerExited(name="n1/cpu0", exit_code=-9)):
        [(_, err)] = hs.send(CLIENT, msg)
        assert err.code == "unexpected"
    assert hs.core.workers[b"w"].busy is not None and not hs.core.book.jobs["j1"].updates


def test_a_node_speaks_for_its_own_workers_only(hs: Harness) -> None:
    hs.send(b"w1", _worker_hello("n1/cpu0", node="n1"))
    hs.send(b"w2", _worker_hello("n2/cpu0", node="n2"))
    node2 = b"node/n2"
    hs.send(node2, Hello(role="node", name="n2", credential=peer_credential(SECRET, "node", "n2")))
    hs.send(node2, WorkerExited(name="n1/cpu0", exit_code=-9))
    assert b"w1" in hs.core.workers
    hs.send(node2, WorkerExited(name="n2/cpu0", exit_code=-9))
    assert b"w2" not in hs.core.workers


def test_a_peer_registering_again_in_another_role_starts_over() -> None:
    h = Harness()                      # no join secret: anyone may register as a worker
    h.hello(CLIENT, "client", "c")
    w = h.worker("n1/cpu0")
    [a] = assigns(h.submit("c1", profile=False))
    h.send(w, Hello(role="client", name="now-a-client"))
    assert w not in h.core.workers and h.core.registry.peers[w].role == "client"
    assert [r.key[1] for q in h.core.assigner.queues.values() for r in q.items()] == ["c1"]   # re-queued
    [(_, err)] = h.send(w, WorkDone(call_id=1, request_id=a.request_id, update=CandidateUpdate(
        job_id="j1", candidate_id="c1", stage="validate", verdict=Verdict(correct=True))))
    assert err.code == "unexpected"


# -- whose a job is -------------------------------------------------------------------------------

VICTIM, ATTACKER, ADMIN = b"client/victim/1", b"client/attacker/1", b"client/admin/1"
TOKENS = {VICTIM: "v" * 32, ATTACKER: "a" * 32}


def _owners(h: Harness) -> Harness:
    """Two plain clients with tokens of their own, and the admin (the core's join secret is SECRET)."""
    from specgen.runtime.auth import admin_credential

    h.core.registry.join_secret = SECRET
    for peer, token in TOKENS.items():
        [(_, w)] = h.hello(peer, "client", peer.decode(), client_token=token)
        assert isinstance(w, Welcome) and not w.admin
    [(_, w)] = h.hello(ADMIN, "client", "admin", credential=admin_credential(SECRET, "admin"))
    assert isinstance(w, Welcome) and w.admin
    return h


def _worker(h: Harness, name: str = "n1/cpu0") -> bytes:
    peer = f"worker/{name}/x".encode()
    assert any(isinstance(m, Welcome) for _, m in h.send(peer, _worker_hello(name)))
    return peer


def _refusal(out: list, peer: bytes) -> ErrorReply:
    [(to, err)] = out
    assert to == peer and isinstance(err, ErrorReply), out
    return err


def test_a_job_takes_candidates_cancels_and_reads_from_its_owner_only() -> None:
    """The red team's attack, on the core: another client names the victim's job (ids leak through
    logs, screens, anything) and submits the candidate id the victim submits next, cancels the
    job, follows it, reads it, resyncs it. Each is refused as not_owner and changes nothing."""
    h = _owners(Harness())
    w = _worker(h)
    [a] = assigns(h.submit("c000", job="J", peer=VICTIM, profile=False))
    job = h.core.book.jobs["J"]
    before = (job.submitter, set(job.subscribers), dict(job.candidates))
    attacks = [
        (SubmitCandidate(call_id=h.call_id(), submission=CandidateSubmission(
            job_id="J", candidate_id="c001", problem_name="p", problem_source=PROBLEM,
            candidate_source="the attacker's")), "submit candidates to"),
        (CancelJob(call_id=h.call_id(), job_id="J"), "cancel"),
        (SubscribeJob(call_id=h.call_id(), job_id="J"), "follow"),
        (GetJob(call_id=h.call_id(), job_id="J"), "read"),
        (ResyncUpdates(call_id=h.call_id(), job_ids=["J"]), "resync the updates of"),
    ]
    for msg, action in attacks:
        err = _refusal(h.send(ATTACKER, msg), ATTACKER)
        assert err.code == "not_owner" and err.ref == msg.call_id
        assert "'J'" in err.message and f"may {action} it" in err.message and "CURVE key" in err.message
    job = h.core.book.jobs["J"]
    assert (job.submitter, job.subscribers, job.candidates) == before and job.state == "running"
    assert h.core.stats(h.now).requests_not_owner == len(attacks)
    # The victim's candidate id c001 is still free, and its verdict is its own.
    [ack] = [m for _, m in h.submit("c001", job="J", peer=VICTIM, profile=False) if isinstance(m, SubmitAck)]
    assert ack.accepted and not ack.duplicate
    assert job.candidates["c001"].candidate_source == "x"
    out = h.finish(w, a)
    assert [(p, u.candidate_id) for p, u in ((p, m.update) for p, m in out
                                             if isinstance(m, CandidateUpdateNotice))] == [(VICTIM, "c000")]


def test_an_id_another_client_holds_cannot_be_created_and_an_ended_job_stays_closed() -> None:
    h = _owners(Harness())
    h.send(VICTIM, CreateJob(call_id=h.call_id(), spec=JobSpec(problem_source=PROBLEM, job_id="J")))
    assert h.core.book.jobs["J"].owner == h.core.registry.peers[VICTIM].owner
    again = CreateJob(call_id=h.call_id(), spec=JobSpec(problem_source=PROBLEM, job_id="J"))
    [(_, created)] = h.send(VICTIM, again)                  # idempotent for its owner
    assert created.job_id == "J"
    assert _refusal(h.send(ATTACKER, CreateJob(call_id=h.call_id(), spec=JobSpec(
        problem_source=PROBLEM, job_id="J"))), ATTACKER).code == "not_owner"
    reasoner = b"reasoner/J/x"
    h.send(reasoner, Hello(role="reasoner", name="J", credential=reasoner_credential(SECRET, "J", 1)))
    h.send(reasoner, ReportJobResult(call_id=h.call_id(), result=JobResult(job_id="J", status="succeeded")))
    # Ended: the owner learns it from the journal, the attacker learns nothing.
    [ack] = [m for _, m in h.submit("c9", job="J", peer=VICTIM) if isinstance(m, SubmitAck)]
    assert not ack.accepted and "ended" in ack.reason
    assert _refusal(h.submit("c9", job="J", peer=ATTACKER), ATTACKER).code == "not_owner"
    assert _refusal(h.send(ATTACKER, GetJob(call_id=h.call_id(), job_id="J")), ATTACKER).code == "not_owner"
    assert _refusal(h.send(ATTACKER, CancelJob(call_id=h.call_id(), job_id="J")), ATTACKER).code == "not_owner"


def test_a_reasoner_acts_for_its_own_job_only_and_the_admin_for_every_job() -> None:
    h = _owners(Harness())
    h.send(VICTIM, CreateJob(call_id=h.call_id(), spec=JobSpec(problem_source=PROBLEM, job_id="J")))
    h.send(ATTACKER, CreateJob(call_id=h.call_id(), spec=JobSpec(problem_source=PROBLEM, job_id="K")))
    reasoner = b"reasoner/J/x"
    h.send(reasoner, Hello(role="reasoner", name="J", credential=reasoner_credential(SECRET, "J", 1)))
    w = _worker(h)
    [a] = assigns(h.submit("c1", job="J", peer=reasoner, profile=False))
    [(_, st)] = h.send(reasoner, GetJob(call_id=h.call_id(), job_id="J"))
    assert isinstance(st, JobStatusReply) and st.status.candidates == 1
    assert [u.candidate_id for u in updates(h.finish(w, a))] == ["c1"]   # to the reasoner
    for msg in (SubmitCandidate(call_id=h.call_id(), submission=CandidateSubmission(
                    job_id="K", candidate_id="c1", problem_name="p", problem_source=PROBLEM,
                    candidate_source="x")),
                CancelJob(call_id=h.call_id(), job_id="K"), GetJob(call_id=h.call_id(), job_id="K")):
        assert _refusal(h.send(reasoner, msg), reasoner).code == "not_owner"
    # Nor may it open a job of an id it makes up.
    assert _refusal(h.submit("c1", job="new", peer=reasoner), reasoner).code == "not_owner"
    assert "new" not in h.core.book.jobs
    # The admin reads, follows and cancels any job.
    [(_, st)] = h.send(ADMIN, GetJob(call_id=h.call_id(), job_id="K"))
    assert isinstance(st, JobStatusReply)
    out = h.send(ADMIN, CancelJob(call_id=h.call_id(), job_id="K"))
    assert isinstance(out[-1][1], Ack) and h.core.views.job_status("K").result.status == "cancelled"


def test_stats_name_other_clients_jobs_and_candidates_to_the_admin_only() -> None:
    h = _owners(Harness())
    h.core.registry.peers[b"node/n1"] = h.core.registry.peers[ADMIN].__class__(
        id=b"node/n1", role="node", name="n1", last_seen=h.now,
        health={"n1/cpu0": {"state": "ready", "restarts": 1, "error": "Traceback: candidate c000 of J"}})
    w = _worker(h)
    assigns(h.submit("c000", job="J", peer=VICTIM, profile=False))
    assert h.core.workers[w].busy is not None

    def stats(peer: bytes):
        [(_, reply)] = h.send(peer, GetStats(call_id=h.call_id()))
        return reply.stats

    mine, theirs, full = stats(VICTIM), stats(ATTACKER), stats(ADMIN)
    assert [w.busy_candidate for w in mine.workers] == ["J/c000"] and mine.jobs == ["J"] and mine.restricted
    assert [w.busy_candidate for w in full.workers] == ["J/c000"] and full.jobs == ["J"] and not full.restricted
    assert full.node_health["n1"]["n1/cpu0"]["error"].endswith("of J")
    # The attacker sees that a worker is busy and how much runs, never on what.
    assert [w.busy_stage for w in theirs.workers] == ["validate"] and theirs.validate.running == 1
    assert theirs.restricted and theirs.jobs == [] and theirs.jobs_running == 1
    text = msgspec.json.encode(theirs).decode()
    assert '"J' not in text and "c000" not in text
    assert theirs.node_health["n1"]["n1/cpu0"] == {"state": "ready", "restarts": 1}


def test_ownership_survives_a_restart_through_the_journal(tmp_path) -> None:
    """Jobs are journaled with their owner: a client that comes back with the same token (or key)
    after a scheduler restart acts for its jobs again; a new token does not."""
    path = tmp_path / "journal.sqlite3"
    h = _owners(Harness(Journal(path)))
    h.submit("c1", job="J", peer=VICTIM, profile=False)
    h.journal.close()

    h2 = Harness(Journal(path))
    h2.core.registry.join_secret = SECRET
    again = b"client/victim/2"                          # a new connection, the same token
    h2.hello(again, "client", "victim", client_token=TOKENS[VICTIM])
    h2.hello(ATTACKER, "client", "attacker", client_token=TOKENS[ATTACKER])
    stranger = b"client/victim/3"                       # a new connection, a new token
    h2.hello(stranger, "client", "victim", client_token="s" * 32)
    [(_, st)] = h2.send(again, GetJob(call_id=h2.call_id(), job_id="J"))
    assert isinstance(st, JobStatusReply) and st.status.candidates == 1
    for peer in (ATTACKER, stranger):
        assert _refusal(h2.send(peer, GetJob(call_id=h2.call_id(), job_id="J")), peer).code == "not_owner"
        assert _refusal(h2.submit("c2", job="J", peer=peer), peer).code == "not_owner"
    # The same with CURVE: the key is the identity, whatever the token.
    h3 = Harness(Journal(tmp_path / "curve.sqlite3"))
    h3.core.handle(VICTIM, Hello(role="client", name="v", client_token="v" * 32), h3.now, "KEY-V")
    h3.core.handle(VICTIM, SubmitCandidate(call_id=1, submission=CandidateSubmission(
        job_id="J", candidate_id="c1", problem_name="p", problem_source=PROBLEM, candidate_source="x")),
        h3.now, "KEY-V")
    h3.journal.close()
    h4 = Harness(Journal(tmp_path / "curve.sqlite3"))
    h4.core.handle(b"client/v/new", Hello(role="client", name="v", client_token="n" * 32), h4.now, "KEY-V")
    h4.core.handle(b"client/v/new", GetJob(call_id=2, job_id="J"), h4.now, "KEY-V")
    [(_, welcome), (_, st)] = h4.core.outbox
    assert isinstance(st, JobStatusReply), st


def test_with_curve_a_connection_that_took_over_a_routing_id_is_not_that_peer() -> None:
    """ROUTER_HANDOVER gives a routing id to whichever connection presents it last. With CURVE
    each message's key is checked against the key its peer registered with: another key behind
    the victim's routing id must say Hello, and is then itself, with no right to the victim's job."""
    h = Harness()
    victim = b"client/victim/1"
    h.core.handle(victim, Hello(role="client", name="v"), h.now, "KEY-V")
    h.core.handle(victim, SubmitCandidate(call_id=1, submission=CandidateSubmission(
        job_id="J", candidate_id="c1", problem_name="p", problem_source=PROBLEM, candidate_source="x")),
        h.now, "KEY-V")
    h.core.outbox.clear()
    h.core.handle(victim, GetJob(call_id=2, job_id="J"), h.now, "KEY-A")
    [(_, err)] = h.core.outbox
    assert err.code == "unregistered" and err.ref == 2
    h.core.outbox.clear()
    h.core.handle(victim, Hello(role="client", name="v"), h.now, "KEY-A")
    h.core.handle(victim, GetJob(call_id=3, job_id="J"), h.now, "KEY-A")
    [(_, welcome), (_, err)] = h.core.outbox
    assert isinstance(welcome, Welcome) and err.code == "not_owner"
    assert h.core.book.jobs["J"].submitter is None and not h.core.book.jobs["J"].subscribers


def test_job_ids_the_scheduler_assigns_are_unguessable() -> None:
    import re

    h = _owners(Harness())
    ids = []
    for _ in range(2):
        out = h.send(VICTIM, CreateJob(call_id=h.call_id(), spec=JobSpec(problem_source=PROBLEM)))
        ids += [m.job_id for _, m in out if isinstance(m, JobCreated)]
    assert all(re.fullmatch(r"job-[0-9a-f]{16}", i) for i in ids), ids
    first, second = (i.removeprefix("job-") for i in ids)
    # 64 random bits each: not one after the other, and sharing no prefix to count on.
    assert first != second and int(first, 16) - int(second, 16) not in (-1, 1)
    assert sum(a == b for a, b in zip(first, second)) < 8


def test_a_client_token_too_short_to_be_secret_is_refused() -> None:
    h = Harness()
    [(_, err)] = h.hello(VICTIM, "client", "v", client_token="abc")
    assert err.code == "bad_request" and "client_token" in err.message and "32" in err.message
