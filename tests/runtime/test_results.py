"""The scheduler core's intake of worker results: whose result counts, adopted requests, lost workers' requests."""
from __future__ import annotations

import pytest

from specgen.messages import (
    AssignWork, CancelWork, CandidateUpdate, Heartbeat, HeartbeatAck, Hello, ResyncUpdates, Verdict, WorkDone,
    WorkerExited,
)
from specgen.runtime import results
from specgen.runtime.journal import Journal

from tests.runtime.test_scheduler_core import CLIENT, Harness, assigns, updates


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.hello(CLIENT, "client", "c")
    return harness


def queued(h: Harness) -> list[str]:
    return sorted(r.key[1] for q in h.core.assigner.queues.values() for r in q.items())


def test_results_are_counted_once(h: Harness) -> None:
    w = h.worker("n1/cpu0")
    [a] = assigns(h.submit("c1", profile=False))
    first = h.finish(w, a)
    again = h.finish(w, a)
    assert len(updates(first)) == 1 and not updates(again)
    [hb] = [m for _, m in h.send(w, Heartbeat()) if isinstance(m, HeartbeatAck)]
    assert len(hb.acked) == 2        # the worker is acked either way, in its next heartbeat's ack
    assert h.core.stats(h.now).duplicates_ignored == 1


def test_lost_worker_request_runs_elsewhere_and_is_not_doubled(h: Harness) -> None:
    w1 = h.worker("n1/cpu0")
    [a] = assigns(h.submit("c1", profile=False))
    w2 = h.worker("n2/cpu0")
    out = h.send(b"node/n1/x", Hello(role="node", name="n1"))
    out = h.send(b"node/n1/x", WorkerExited(name="n1/cpu0", exit_code=-9))
    [again] = assigns(out, w2)
    assert again.submission.candidate_id == "c1" and again.request_id != a.request_id
    assert h.core.stats(h.now).requests_requeued == 1
    assert len(updates(h.finish(w2, again))) == 1
    # The dead worker's late answer (e.g. it was only cut off) changes nothing.
    assert not updates(h.finish(w1, a))


def test_a_request_that_kills_every_worker_fails_after_max_attempts(h: Harness) -> None:
    node = b"node/n1/x"
    h.send(node, Hello(role="node", name="n1"))
    [a] = assigns(h.submit("poison", profile=False) or []) or [None]
    assert a is None  # no worker yet
    last = []
    for i in range(h.settings.max_request_attempts):
        peer = h.worker(f"n1/cpu{i}")
        h.core.schedule(h.now)
        last = h.send(node, WorkerExited(name=f"n1/cpu{i}", exit_code=-9))
    [u] = updates(last)
    assert "max_request_attempts" in (u.verdict.error or "")


def _done(h: Harness, worker: bytes, request_id: str, cid: str, stage: str = "validate",
          job: str = "j1", speedup: float | None = None) -> list:
    """A WorkDone as `worker` would send it, for any request id and candidate."""
    v = Verdict(stage=stage, compiled=True, correct=True, speedup=speedup)
    upd = CandidateUpdate(job_id=job, candidate_id=cid, stage=stage, verdict=v, worker=worker.decode(),
                          started_at=h.wall - 1, finished_at=h.wall)
    return h.send(worker, WorkDone(call_id=h.call_id(), request_id=request_id, update=upd))


def _acked(h: Harness, worker: bytes) -> list[int]:
    [ack] = [m for _, m in h.send(worker, Heartbeat()) if isinstance(m, HeartbeatAck)]
    return ack.acked


def test_a_result_from_a_worker_the_request_was_not_assigned_to_is_refused(h: Harness) -> None:
    w1, w2 = h.worker("n1/cpu0"), h.worker("n1/cpu1")
    [(owner, a)] = [(p, m) for p, m in h.submit("c1", profile=False) if isinstance(m, AssignWork)]
    intruder = w2 if owner == w1 else w1
    out = _done(h, intruder, a.request_id, "c1")
    assert not updates(out) and h.core.stats(h.now).results_refused == 1
    assert h.core.workers[owner].busy is not None and h.core.workers[intruder].busy is None
    assert _acked(h, intruder)                 # acknowledged all the same: not re-sent forever
    [u] = updates(h.finish(owner, a))          # the assigned worker's answer counts
    assert u.candidate_id == "c1" and u.worker == owner.decode()
    stats = h.core.stats(h.now)
    assert stats.requests_done == 1 and stats.results_refused == 1 and stats.duplicates_ignored == 0


def test_a_result_for_a_queued_request_is_refused() -> None:
    h = Harness(pool_mode="static", static_validate_workers=1)
    h.hello(CLIENT, "client", "c")
    w = h.worker("n1/cpu0")
    [first] = assigns(h.submit("c1", profile=False))
    h.submit("c2", profile=False)                 # waits behind c1
    queued = [r for q in h.core.assigner.queues.values() for r in q.items()]
    assert [r.key[1] for r in queued] == ["c2"]
    # The busy worker answers the queued request under made-up ids: ours, an old scheduler's, none.
    for rid in (f"{h.core.scheduler_id}-99", "0123456789ab-1", ""):
        assert not updates(_done(h, w, rid, "c2"))
    assert h.core.stats(h.now).results_refused == 3
    assert [r.key[1] for q in h.core.assigner.queues.values() for r in q.items()] == ["c2"]
    out = h.finish(w, first)
    [nxt] = assigns(out, w)
    assert nxt.submission.candidate_id == "c2"
    [u] = updates(h.finish(w, nxt))
    assert u.candidate_id == "c2" and h.core.stats(h.now).requests_done == 2


def test_a_result_for_another_workers_assignment_is_refused(h: Harness) -> None:
    w1, w2 = h.worker("n1/cpu0"), h.worker("n1/cpu1")
    out = h.submit("c1", profile=False) + h.submit("c2", profile=False)
    by_worker = {p: m for p, m in out if isinstance(m, AssignWork)}
    assert set(by_worker) == {w1, w2}
    a1, a2 = by_worker[w1], by_worker[w2]
    out = _done(h, w2, a1.request_id, a1.submission.candidate_id)
    assert not updates(out) and h.core.stats(h.now).results_refused == 1
    assert h.core.workers[w1].busy is not None and h.core.workers[w2].busy is not None
    assert len(updates(h.finish(w1, a1))) == 1
    assert len(updates(h.finish(w2, a2))) == 1
    assert h.core.stats(h.now).requests_done == 2


def test_an_update_for_another_candidate_than_the_assignment_is_refused_and_the_request_rerun(h: Harness) -> None:
    w = h.worker("n1/cpu0")
    [a] = assigns(h.submit("c1", profile=False))
    out = _done(h, w, a.request_id, "c-other")
    assert not updates(out) and h.core.stats(h.now).results_refused == 1
    [again] = assigns(out, w)                    # back in its queue, and run again
    assert again.submission.candidate_id == "c1" and again.request_id != a.request_id
    [u] = updates(h.finish(w, again))
    assert u.candidate_id == "c1"


def _lose(h: Harness, worker_name: str) -> list:
    h.send(b"node/n1/x", Hello(role="node", name="n1"))
    return h.send(b"node/n1/x", WorkerExited(name=worker_name, exit_code=-9))


def test_a_stale_result_for_a_reassigned_request_is_refused(h: Harness) -> None:
    old = h.worker("n1/cpu0")
    [a] = assigns(h.submit("c1", profile=False))
    new = h.worker("n1/cpu1")
    [again] = assigns(_lose(h, "n1/cpu0"), new)   # taken back from the lost worker, given to the other
    assert again.request_id != a.request_id
    # The lost worker was only cut off: it registers again, says it kept the result, sends it.
    h.send(old, Hello(role="worker", name="n1/cpu0", node="n1", held_results=[a.request_id]))
    out = h.finish(old, a)
    assert not updates(out) and h.core.stats(h.now).results_refused == 1
    assert h.core.workers[new].busy is not None
    [u] = updates(h.finish(new, again))
    assert u.worker == new.decode() and h.core.stats(h.now).requests_done == 1
    # Registering again without listing it: refused as well.
    h.send(old, Hello(role="client", name="x"))
    h.send(old, Hello(role="worker", name="n1/cpu0", node="n1"))
    assert not updates(h.finish(old, a)) and h.core.stats(h.now).results_refused == 2


def test_a_lost_workers_kept_result_counts_while_nobody_else_took_the_request(h: Harness) -> None:
    w = h.worker("n1/cpu0")
    [a] = assigns(h.submit("c1", profile=False))
    _lose(h, "n1/cpu0")
    assert [r.key[1] for q in h.core.assigner.queues.values() for r in q.items()] == ["c1"]
    # Back, with the result it finished meanwhile: it is given the request again at once and
    # its kept result still counts (the new attempt is cancelled).
    out = h.send(w, Hello(role="worker", name="n1/cpu0", node="n1", held_results=[a.request_id]))
    [again] = assigns(out, w)
    out = h.finish(w, a)
    [u] = updates(out)
    assert u.candidate_id == "c1" and h.core.stats(h.now).results_refused == 0
    assert [m.request_id for p, m in out if isinstance(m, CancelWork)] == [again.request_id]
    v = Verdict(stage="validate", error="cancelled")
    out = h.send(w, WorkDone(call_id=h.call_id(), request_id=again.request_id, update=CandidateUpdate(
        job_id="j1", candidate_id="c1", stage="validate", verdict=v, cancelled=True)))
    assert not updates(out) and h.core.workers[w].busy is None
    stats = h.core.stats(h.now)
    assert stats.results_refused == 0 and stats.requests_done == 1


def test_a_worker_still_running_a_request_taken_back_from_it_keeps_it(h: Harness) -> None:
    w = h.worker("n1/cpu0")
    [a] = assigns(h.submit("c1", profile=False))
    _lose(h, "n1/cpu0")
    out = h.send(w, Hello(role="worker", name="n1/cpu0", node="n1", busy_request_id=a.request_id,
                          busy_key=["j1", "c1", "validate"]))
    assert not assigns(out) and h.core.workers[w].busy is not None   # adopted, not queued again
    [u] = updates(h.finish(w, a))
    assert u.candidate_id == "c1" and h.core.stats(h.now).results_refused == 0


def test_a_worker_cannot_claim_a_request_it_never_had(h: Harness) -> None:
    h.worker("n1/cpu0")
    [a] = assigns(h.submit("c1", profile=False))
    _lose(h, "n1/cpu0")
    # Another worker claims, on registering, to be running the request taken back from n1/cpu0.
    other = b"worker/n1/cpu7/x"
    out = h.send(other, Hello(role="worker", name="n1/cpu7", node="n1", busy_request_id=a.request_id,
                              busy_key=["j1", "c1", "validate"], held_results=[a.request_id]))
    assert not assigns(out)
    assert [r.key[1] for q in h.core.assigner.queues.values() for r in q.items()] == ["c1"]   # still queued
    out = _done(h, other, a.request_id, "c1")
    assert not updates(out) and h.core.stats(h.now).results_refused == 1
    # The request runs for real: assigned afresh (to the now idle worker), and that answer counts.
    [again] = assigns(out, other)
    assert again.submission.candidate_id == "c1" and again.request_id != a.request_id
    [u] = updates(h.finish(other, again))
    assert u.candidate_id == "c1" and h.core.stats(h.now).requests_done == 1


def test_after_a_restart_kept_results_listed_in_the_hello_count_and_others_are_refused(tmp_path) -> None:
    path = tmp_path / "journal.sqlite3"
    h = Harness(Journal(path))
    h.hello(CLIENT, "client", "c")
    w = h.worker("n1/cpu0")
    [a1] = assigns(h.submit("c1", profile=False))
    h.submit("c2", profile=False)
    # The worker finishes c1, but its result never reaches this scheduler: it dies.
    h.journal.close()

    h2 = Harness(Journal(path))
    h2.hello(CLIENT, "client", "c")
    h2.send(CLIENT, ResyncUpdates(call_id=h2.call_id(), job_ids=["j1"]))   # the submitter is back
    assert sorted(r.key[1] for q in h2.core.assigner.queues.values() for r in q.items()) == ["c1", "c2"]
    other = h2.worker("n1/cpu1")          # registers first and takes a request
    # The worker registers again listing the result it kept, then re-sends it: it counts.
    out = h2.send(w, Hello(role="worker", name="n1/cpu0", node="n1", held_results=[a1.request_id]))
    out += h2.finish(w, a1)
    assert [(u.candidate_id, u.stage) for u in updates(out)] == [("c1", "validate")]
    # A result under an old scheduler's id that the sender never listed: refused.
    assert not updates(_done(h2, other, "0123456789ab-7", "c2"))
    stats = h2.core.stats(h2.now)
    assert stats.results_refused == 1 and stats.requests_done == 1
    # c2 still completes through its real assignment; whoever runs c1 again is cancelled.
    for peer in (w, other):
        st = h2.core.workers[peer]
        if st.busy is not None and st.busy.key[1] == "c2":
            assign = AssignWork(request_id=st.busy.request_id, stage="validate", submission=st.busy.submission)
            assert [u.candidate_id for u in updates(h2.finish(peer, assign))] == ["c2"]
    assert h2.core.views.job_status("j1").updates == 2


def test_a_request_a_worker_says_it_runs_for_no_live_candidate_is_an_orphan_whose_result_is_dropped(h: Harness) -> None:
    """A worker still running an earlier scheduler's request for a job this one never had keeps
    it (it is busy until it answers), and its answer is dropped, neither counted nor refused."""
    w = b"worker/n1/cpu0/x"
    h.send(w, Hello(role="worker", name="n1/cpu0", node="n1", busy_request_id="0123456789ab-5",
                    busy_key=["gone", "c9", "validate"]))
    busy = h.core.workers[w].busy
    assert busy is not None and busy.orphan and busy.request_id == "0123456789ab-5"
    assert not assigns(h.submit("c1", profile=False))          # busy with the orphan: nothing for it
    out = _done(h, w, "0123456789ab-5", "c9", job="gone")
    assert [u.candidate_id for u in updates(out)] == []
    stats = h.core.stats(h.now)
    assert stats.duplicates_ignored == 1 and stats.results_refused == 0 and stats.requests_done == 0
    [a] = assigns(out, w)                                      # free again: it takes the waiting request
    assert a.submission.candidate_id == "c1"


def test_after_a_restart_a_kept_result_wins_over_a_worker_that_adopted_the_same_request(tmp_path) -> None:
    path = tmp_path / "journal.sqlite3"
    h = Harness(Journal(path))
    h.hello(CLIENT, "client", "c")
    w1 = h.worker("n1/cpu0")
    [a] = assigns(h.submit("c1", profile=False), w1)
    h.journal.close()

    h2 = Harness(Journal(path))
    h2.hello(CLIENT, "client", "c")
    h2.send(CLIENT, ResyncUpdates(call_id=h2.call_id(), job_ids=["j1"]))
    # Another worker says, on registering, that it runs the request (a stray copy of it).
    w2 = b"worker/n1/cpu1/x"
    h2.send(w2, Hello(role="worker", name="n1/cpu1", node="n1", busy_request_id=a.request_id,
                      busy_key=["j1", "c1", "validate"]))
    assert queued(h2) == [] and h2.core.workers[w2].busy is not None
    # The worker that finished it registers again listing the kept result, and sends it.
    h2.send(w1, Hello(role="worker", name="n1/cpu0", node="n1", held_results=[a.request_id]))
    out = h2.finish(w1, a)
    assert [(u.candidate_id, u.worker) for u in updates(out)] == [("c1", w1.decode())]
    assert [(p, m.request_id) for p, m in out if isinstance(m, CancelWork)] == [(w2, a.request_id)]
    # The stopped copy's answer changes nothing.
    assert not updates(h2.finish(w2, a))
    stats = h2.core.stats(h2.now)
    assert stats.requests_done == 1 and stats.duplicates_ignored == 1 and stats.results_refused == 0


def test_requests_taken_back_from_lost_workers_are_remembered_up_to_a_bound(h: Harness, monkeypatch) -> None:
    monkeypatch.setattr(results, "_MAX_RELEASED", 2)
    names = [f"n1/cpu{i}" for i in range(3)]
    peers = [h.worker(name) for name in names]
    for cid in ("c0", "c1", "c2"):
        h.submit(cid, profile=False)
    rid_of = {h.core.workers[p].name: h.core.workers[p].busy.request_id for p in peers}
    cand_of = {h.core.workers[p].name: h.core.workers[p].busy.key[1] for p in peers}
    assert len(set(rid_of.values())) == 3
    h.send(b"node/n1/x", Hello(role="node", name="n1"))
    for name in names:
        h.send(b"node/n1/x", WorkerExited(name=name, exit_code=-9))
    assert queued(h) == ["c0", "c1", "c2"]
    # The latest two are remembered, with the worker each was taken from; the oldest is forgotten.
    assert [(rid, name) for rid, (name, _) in h.core.results.released.items()] == [
        (rid_of["n1/cpu1"], "n1/cpu1"), (rid_of["n1/cpu2"], "n1/cpu2")]
    # So the first worker's kept result no longer counts when it comes back with it.
    h.send(peers[0], Hello(role="worker", name="n1/cpu0", node="n1", held_results=[rid_of["n1/cpu0"]]))
    assert not updates(_done(h, peers[0], rid_of["n1/cpu0"], cand_of["n1/cpu0"]))
    assert h.core.stats(h.now).results_refused == 1
