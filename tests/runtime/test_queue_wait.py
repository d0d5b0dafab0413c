"""A queued evaluation is not a dead one: the scheduler acknowledges it with its queue position
and keeps reporting on it (EvaluateQueued), and the caller's call_timeout_s bounds only the
scheduler's silence about it. On the core with fake peers, on a client against a hand-driven
scheduler, and end to end with real evaluations queued far longer than the caller's timeout.
"""
from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
import zmq

from specgen.messages import (
    AssignWork, CandidateSubmission, CandidateUpdate, EvaluateQueued, EvaluateReply, EvaluateRequest,
    Hello, Verdict, Welcome, WorkDone,
)
from specgen.runtime import wire
from specgen.runtime.client import Client
from specgen.runtime.local import LocalCluster
from specgen.runtime.replay_evaluator import ReplaySample, directive
from specgen.runtime.settings import RuntimeSettings
from specgen.runtime.transport import CallTimeout

from tests.runtime.conftest import WRONG, quick_eval_settings
from tests.runtime.test_scheduler_core import PROBLEM, Harness, assigns

A, B, C = b"client/a/1", b"client/b/1", b"client/c/1"


def evaluate(h: Harness, caller: bytes, call_id: int, interval: float = 1.0) -> list:
    sub = CandidateSubmission(job_id="", candidate_id=f"d{call_id}", problem_name="p", problem_source=PROBLEM,
                              candidate_source="x", extracted_at=h.wall)
    h.advance(0.001)
    return h.send(caller, EvaluateRequest(call_id=call_id, submission=sub, stage="validate",
                                          progress_interval_s=interval))


def notices(out: list) -> dict[tuple[bytes, int], EvaluateQueued]:
    return {(p, m.call_id): m for p, m in out if isinstance(m, EvaluateQueued)}


def finish(h: Harness, worker: bytes, assign: AssignWork) -> list:
    sub = assign.submission
    upd = CandidateUpdate(job_id="", candidate_id=sub.candidate_id, stage=assign.stage,
                          verdict=Verdict(stage=assign.stage, compiled=True), started_at=h.wall, finished_at=h.wall)
    return h.send(worker, WorkDone(call_id=h.call_id(), request_id=assign.request_id, update=upd))


def answers(h: Harness, worker: bytes, first: AssignWork) -> list[tuple[bytes, int]]:
    """Let the worker finish what it is given until nothing is left: whom it answered, in order."""
    order = []
    current: AssignWork | None = first
    while current is not None:
        out = finish(h, worker, current)
        order += [(p, m.call_id) for p, m in out if isinstance(m, EvaluateReply)]
        nxt = assigns(out, worker)
        current = nxt[0] if nxt else None
    return order


def test_core_acknowledges_queued_evaluations_and_serves_callers_in_turn() -> None:
    h = Harness(peer_timeout_s=1e6)
    for peer, name in ((A, "a"), (B, "b"), (C, "c")):
        h.hello(peer, "client", name)
    w = h.worker("n1/cpu0")
    out = evaluate(h, C, 1)
    [blocker] = assigns(out, w)
    assert not notices(out)                      # taken at once: nothing to acknowledge
    acks = {}
    for caller, call_id in ((A, 1), (A, 2), (A, 3), (B, 1), (B, 2)):   # A queues first, and more
        out = evaluate(h, caller, call_id)
        [(key, ack)] = notices(out).items()
        assert key == (caller, call_id) and not ack.running
        acks[key] = ack.position
    # Positions when queued: B's first goes right after A's first (turns), not after all of A's.
    assert acks == {(A, 1): 1, (A, 2): 2, (A, 3): 3, (B, 1): 2, (B, 2): 4}
    # Every interval each caller hears of each request: where it stands, or that it runs.
    h.advance(1.0)
    h.core.tick(h.now)
    h.core.schedule(h.now)
    now = notices(h.core.outbox)
    h.core.outbox.clear()
    assert {k: m.position for k, m in now.items() if not m.running} == {
        (A, 1): 1, (B, 1): 2, (A, 2): 3, (B, 2): 4, (A, 3): 5}
    assert now[(C, 1)].running and now[(C, 1)].queued == 5
    # The worker serves them in that order, each caller its turn.
    assert answers(h, w, blocker) == [(C, 1), (A, 1), (B, 1), (A, 2), (B, 2), (A, 3)]
    # Answered requests are not reported on again.
    h.advance(5.0)
    h.core.tick(h.now)
    h.core.schedule(h.now)
    assert not notices(h.core.outbox)


def test_core_order_of_service_is_round_robin_across_callers() -> None:
    h = Harness(peer_timeout_s=1e6)
    for peer, name in ((A, "a"), (B, "b"), (C, "c")):
        h.hello(peer, "client", name)
    w = h.worker("n1/cpu0")
    [blocker] = assigns(evaluate(h, C, 100))
    n = 0
    for caller, count in ((A, 6), (B, 2), (C, 3)):   # one after another, A with the most
        for _ in range(count):
            n += 1
            evaluate(h, caller, n)
    order = answers(h, w, blocker)[1:]
    # One turn each per round; C had its first with the blocker.
    assert "".join({A: "A", B: "B", C: "C"}[p] for p, _ in order) == "AB" "ABC" "AC" "AC" "A" "A"


def test_no_notices_for_callers_that_did_not_ask() -> None:
    h = Harness(peer_timeout_s=1e6)
    h.hello(A, "client", "a")
    h.worker("n1/cpu0")
    evaluate(h, A, 1, interval=0)
    out = evaluate(h, A, 2, interval=0)
    assert not notices(out)
    h.advance(60)
    h.core.tick(h.now)
    h.core.schedule(h.now)
    assert not notices(h.core.outbox)


# -- the client's side: silence, not waiting, is what times out -----------------------------------

class HandDrivenScheduler:
    """A ROUTER that welcomes one client, records its EvaluateRequests, and sends what the test
    hands it (its own thread alone touches the socket)."""

    def __init__(self, address: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.bind(address)
        self.address = address
        self.requests: list[EvaluateRequest] = []
        self.peer = b""
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            while not self._out.empty():
                self.sock.send_multipart([self.peer, *wire.encode(self._out.get())])
            if not self.sock.poll(10):
                continue
            peer, *frames = self.sock.recv_multipart()
            msg = wire.decode(frames, 1 << 20)
            if isinstance(msg, Hello):
                self.peer = peer
                self._out.put(Welcome(scheduler_id="s", heartbeat_interval_s=0.1, peer_timeout_s=5.0,
                                      max_message_bytes=1 << 20))
            elif isinstance(msg, EvaluateRequest):
                self.requests.append(msg)

    def send(self, msg) -> None:
        self._out.put(msg)

    def next_request(self) -> EvaluateRequest:
        deadline = time.monotonic() + 5
        while not self.requests:
            assert time.monotonic() < deadline, "no EvaluateRequest came"
            time.sleep(0.01)
        return self.requests.pop(0)

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close(0)
        self.ctx.term()


def test_client_waits_while_notices_come_and_times_out_only_on_silence(tmp_path: Path) -> None:
    fake = HandDrivenScheduler(f"ipc://{tmp_path}/fake.sock")
    settings = RuntimeSettings(call_timeout_s=1.0, heartbeat_interval_s=0.1, peer_timeout_s=5.0)
    try:
        with Client(fake.address, settings=settings) as client:
            seen: list[EvaluateQueued] = []
            result: dict = {}

            def call() -> None:
                try:
                    result["verdict"] = client.evaluate(PROBLEM, "x", stage="validate", on_progress=seen.append)
                except Exception as exc:  # noqa: BLE001 - checked below
                    result["error"] = exc

            t0 = time.monotonic()
            caller = threading.Thread(target=call)
            caller.start()
            request = fake.next_request()
            assert request.progress_interval_s == pytest.approx(0.25)   # a quarter of call_timeout_s
            # 3.5 s in the queue, three and a half times the caller's timeout, reported on as asked.
            for position in range(14, 0, -1):
                fake.send(EvaluateQueued(call_id=request.call_id, position=position, queued=position))
                time.sleep(0.25)
            fake.send(EvaluateQueued(call_id=request.call_id, running=True))
            time.sleep(0.25)
            fake.send(EvaluateReply(call_id=request.call_id, update=CandidateUpdate(
                job_id="", candidate_id=request.submission.candidate_id, stage="validate",
                verdict=Verdict(stage="validate", compiled=True, correct=True))))
            caller.join(5)
            assert "error" not in result, result.get("error")
            assert result["verdict"].correct and time.monotonic() - t0 > 3.5
            assert [n.position for n in seen if not n.running] == list(range(14, 0, -1)) and seen[-1].running

            # Now the scheduler reports twice, then says nothing: the call fails a timeout later.
            caller = threading.Thread(target=call)
            result.clear()
            caller.start()
            request = fake.next_request()
            for position in (7, 6):
                fake.send(EvaluateQueued(call_id=request.call_id, position=position, queued=9))
                time.sleep(0.25)
            last = time.monotonic()
            caller.join(5)
            waited = time.monotonic() - last
            error = result.get("error")
            assert isinstance(error, CallTimeout), result
            assert "call_timeout_s" in str(error) and "queued at position 6" in str(error)
            assert 0.5 < waited < 2.5
    finally:
        fake.close()


# -- end to end ----------------------------------------------------------------------------------

def queue_from(clients: list[Client], per_client: int, source: Callable[[int, int], str], problem: str,
               ) -> tuple[dict[tuple[int, int], tuple[float, float, list[EvaluateQueued], object]], float]:
    """`per_client` evaluations from each client, all waiting at once, one client after another
    (the next starts once the scheduler acknowledged the previous one's as queued). Returns
    (client, i) -> (sent, answered, its notices, verdict or error), and when the first was sent."""
    results: dict[tuple[int, int], tuple[float, float, list[EvaluateQueued], object]] = {}
    threads = []
    t0 = time.monotonic()
    for c, client in enumerate(clients):
        acked = threading.Semaphore(0)
        for i in range(per_client):
            def call(c: int = c, i: int = i, client: Client = client, acked: threading.Semaphore = acked) -> None:
                seen: list[EvaluateQueued] = []

                def progress(n: EvaluateQueued) -> None:
                    if not seen:
                        acked.release()
                    seen.append(n)

                start = time.monotonic()
                try:
                    outcome: object = client.evaluate(problem, source(c, i), stage="validate", on_progress=progress)
                except Exception as exc:  # noqa: BLE001 - checked by the caller
                    outcome = exc
                results[(c, i)] = (start, time.monotonic(), seen, outcome)

            threads.append(threading.Thread(target=call, daemon=True))
            threads[-1].start()
        for _ in range(per_client - 2):   # the first two may go to idle workers unqueued
            acked.acquire(timeout=30)
    for t in threads:
        t.join(150)
    return results, t0


def test_200_queued_evaluations_on_two_workers_outwait_the_callers_timeout() -> None:
    """200 evaluations on two CPU workers, queued by 4 clients one after another; each client at
    its defaults but for call_timeout_s, cut to 3 s so that the queue keeps nearly every call
    waiting past it (the workers replay a service time of 0.15 s each: the queue, not the
    evaluations, is what this is about). Every one is answered; the scheduler reported each
    queued one's position, coming down; and the clients are served in turn: all of them get their
    last answers near the end, none first and none last."""
    clients, per_client, timeout = 4, 50, 3.0
    with LocalCluster(workers=2, evaluator="replay", settings=quick_eval_settings()) as cluster:
        conns = [Client(cluster.address, settings=RuntimeSettings(call_timeout_s=timeout)) for _ in range(clients)]
        try:
            results, t0 = queue_from(
                conns, per_client, lambda c, i: directive(ReplaySample(validate_s=0.15, correct=i % 2 == 0))
                + f"# client {c}, evaluation {i}\n", "class Model: pass\n")
        finally:
            for client in conns:
                client.close()
    assert len(results) == clients * per_client
    failures = [o for *_, o in results.values() if not isinstance(o, Verdict)]
    assert not failures, failures[:3]
    for (c, i), (*_, verdict) in results.items():
        assert verdict.correct == (i % 2 == 0) and "replayed" in verdict.flags   # type: ignore[attr-defined]
    waits = sorted(end - start for start, end, _, _ in results.values())
    total = max(end for _, end, _, _ in results.values()) - t0
    assert waits[-1] > 4 * timeout and sum(w > timeout for w in waits) > 150, waits[-5:]
    # Acknowledged with a position, reported on while it waited, the position coming down once
    # every client had queued (until then later clients' turns can come before it).
    queued = [seen for _, _, seen, _ in results.values() if seen and not seen[0].running]
    assert len(queued) >= clients * per_client - 2
    longest = max(queued, key=len)
    positions = [n.position for n in longest if not n.running]
    peak = positions.index(max(positions))
    assert positions[peak] > 100 and len(positions) > 10 and positions[-1] <= 20
    assert positions[peak:] == sorted(positions[peak:], reverse=True)
    # Served in turn: with one queue in arrival order the first client would be done at a quarter.
    last = sorted(max(end for (cc, _), (_, end, _, _) in results.items() if cc == c) - t0 for c in range(clients))
    print(f"\n200 queued on 2 workers: {total:.1f} s, longest wait {waits[-1]:.1f} s, "
          f"{sum(w > timeout for w in waits)} waited past call_timeout_s={timeout:g} s; "
          f"the clients' last answers at {[round(v, 1) for v in last]} s")
    assert last[0] > 0.85 * total


def test_real_evaluations_queued_past_the_callers_timeout_are_answered(softmax_problem: str,
                                                                       softmax_candidate: str) -> None:
    """The same with real evaluations on two CPU workers (a candidate that takes 0.8 s to import
    and then fails its first check, and a few correct ones): 24 queued by 2 clients with
    call_timeout_s of 2 s, each answered with its real verdict after waiting several times that.
    (A runner is ready in a tenth of a second: without the import's sleep the queue would drain
    before any caller's timeout.)"""
    clients, per_client, timeout = 2, 12, 2.0
    slow_wrong = "import time\ntime.sleep(0.8)\n" + WRONG
    with LocalCluster(workers=2, settings=quick_eval_settings()) as cluster:
        conns = [Client(cluster.address, settings=RuntimeSettings(call_timeout_s=timeout)) for _ in range(clients)]
        try:
            results, t0 = queue_from(conns, per_client,
                                     lambda c, i: softmax_candidate if i % 6 == 0 else slow_wrong,
                                     softmax_problem)
        finally:
            for client in conns:
                client.close()
    failures = [o for *_, o in results.values() if not isinstance(o, Verdict)]
    assert len(results) == clients * per_client and not failures, failures[:3]
    for (c, i), (*_, verdict) in results.items():
        assert verdict.compiled and verdict.correct == (i % 6 == 0), verdict   # type: ignore[attr-defined]
    waits = sorted(end - start for start, end, _, _ in results.values())
    print(f"\n24 real evaluations queued: longest wait {waits[-1]:.1f} s, "
          f"{sum(w > timeout for w in waits)} past call_timeout_s={timeout:g} s")
    assert waits[-1] > 3 * timeout and sum(w > timeout for w in waits) > 12
