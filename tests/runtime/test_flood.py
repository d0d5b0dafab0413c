"""Floods: the scheduler's receive loop handles every message it reads, exactly once, in order.

The loop takes a bounded batch of the messages already waiting (`SchedulerActor.batch_limit`), so
that replies go out under a flood; what the bound leaves must stay in the socket whole. Checked
on the receive loop itself with real sockets and random batch bounds and bursts, and end to end:
many clients flooding a real scheduler, every request answered.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import msgspec
import zmq
from hypothesis import HealthCheck, given, settings, strategies as st

from specgen.messages import (
    PROTOCOL_VERSION, EvaluateReply, EvaluateRequest, CandidateSubmission, ErrorReply, Ping, Pong,
)
from specgen.runtime import wire
from specgen.runtime.client import Client
from specgen.runtime.local import LocalCluster
from specgen.runtime.replay_evaluator import ReplaySample, directive
from specgen.runtime.scheduler import SchedulerActor
from specgen.runtime.settings import RuntimeSettings
from specgen.runtime.socket_io import recv_frame


class Recorder:
    """Stands in for the scheduler core: records what the loop hands it, in order."""

    def __init__(self) -> None:
        self.handled: list[tuple[bytes, object]] = []

    def handle(self, peer: bytes, msg: object, now: float, curve_key: str | None = None) -> None:
        self.handled.append((peer, ("ok", msg.call_id)))  # type: ignore[attr-defined]


class ReceiveRig:
    """A SchedulerActor's socket and receive loop, its core replaced by a Recorder, and DEALER
    peers that send it bursts. Everything the loop handles (or refuses) lands in `handled`."""

    def __init__(self, state_dir: Path, name: str) -> None:
        self.actor = SchedulerActor(f"inproc://{name}", state_dir, RuntimeSettings(max_message_bytes=4096))
        self.recorder = Recorder()
        self.actor.core = self.recorder  # type: ignore[assignment]
        self.actor._send = self._refused  # type: ignore[method-assign]
        self.actor.sock.setsockopt(zmq.RCVTIMEO, 2000)
        self.peers: dict[bytes, zmq.Socket] = {}
        self.batches: list[int] = []

    def _refused(self, frames: list) -> None:
        peer, body = frames[0], bytes(frames[1])
        err = wire.decode_frame(body, 1 << 20)
        assert isinstance(err, ErrorReply)
        if err.code == "malformed" and "expected 1 frame" in err.message:
            entry = ("multi", int(err.message.rsplit(" ", 1)[1]))
        else:
            entry = (err.code, err.ref)
        self.recorder.handled.append((peer, entry))

    def peer(self, identity: bytes) -> zmq.Socket:
        sock = self.peers.get(identity)
        if sock is None:
            sock = self.actor.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.ROUTING_ID, identity)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.actor.address)
            self.peers[identity] = sock
        return sock

    def drive(self, expected: int, batch_flags: list[bool]) -> None:
        """What SchedulerActor._loop does with its socket, until `expected` more were handled."""
        handled = self.recorder.handled
        goal = len(handled) + expected
        calls = 0
        while len(handled) < goal:
            waiting = goal - len(handled)
            try:
                peer = recv_frame(self.actor.sock, 0)
            except zmq.Again:
                raise AssertionError(f"{waiting} messages never arrived") from None
            batch = batch_flags[calls % len(batch_flags)]
            calls += 1
            before = len(handled)
            self.actor._receive(time.monotonic(), peer, batch=batch)
            n = len(handled) - before
            # The bound holds, and a batch takes everything waiting up to it.
            assert n == (min(waiting, self.actor.batch_limit) if batch else 1), (n, waiting, batch)
            self.batches.append(n)

    def close(self) -> None:
        for sock in self.peers.values():
            sock.close(0)
        self.actor.close()


def _frames(kind: str, seq: int) -> list[bytes]:
    if kind == "ok":
        return wire.encode(Ping(call_id=seq))
    if kind == "unknown":       # one frame, refused with the call id read back
        return [b"SG" + bytes((PROTOCOL_VERSION, 200)) + msgspec.msgpack.encode({"call_id": seq})]
    return [b"x" * (seq % 5)] * (2 + seq % 3)   # several frames: refused as a whole


def _expected(kind: str, seq: int) -> tuple:
    if kind == "ok":
        return ("ok", seq)
    if kind == "unknown":
        return ("unknown_kind", seq)
    return ("multi", 2 + seq % 3)


_kinds = st.sampled_from(["ok", "ok", "ok", "unknown", "multi"])
_plans = st.fixed_dictionaries({
    "limit": st.integers(1, 12),
    "peers": st.integers(1, 4),
    "bursts": st.lists(st.lists(st.tuples(st.integers(0, 3), _kinds), max_size=70), min_size=1, max_size=4),
    "batch_flags": st.lists(st.booleans(), min_size=1, max_size=5).filter(any),
})


def test_receive_loop_handles_every_message_once_in_order_per_peer(tmp_path: Path) -> None:
    rig = ReceiveRig(tmp_path, "receive-property")
    examples = iter(range(10**9))
    try:
        @settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
        @given(_plans)
        def check(plan: dict) -> None:
            rig.actor.batch_limit = plan["limit"]
            example = next(examples)
            names = [f"e{example}-p{i}".encode() for i in range(plan["peers"])]
            sent: dict[bytes, list[tuple]] = {name: [] for name in names}
            rig.recorder.handled.clear()
            for burst in plan["bursts"]:
                for n, (who, kind) in enumerate(burst):
                    name = names[who % len(names)]
                    seq = len(sent[name]) + 1
                    rig.peer(name).send_multipart(_frames(kind, seq))
                    sent[name].append(_expected(kind, seq))
                rig.drive(len(burst), plan["batch_flags"])
            got: dict[bytes, list[tuple]] = {name: [] for name in names}
            for peer, entry in rig.recorder.handled:
                got[peer].append(entry)
            assert got == sent

        check()
    finally:
        rig.close()


def test_a_burst_past_the_batch_bound_loses_nothing(tmp_path: Path) -> None:
    """The original loss, at the real bound: 3 peers x 2,000 pings queued at once."""
    rig = ReceiveRig(tmp_path, "receive-burst")
    try:
        names = [b"a", b"b", b"c"]
        for i in range(1, 2001):
            for name in names:
                rig.peer(name).send_multipart(wire.encode(Ping(call_id=i)))
        rig.drive(6000, [True])
        assert rig.batches == [1024] * 5 + [6000 - 5 * 1024]
        for name in names:
            assert [e for p, e in rig.recorder.handled if p == name] == [("ok", i) for i in range(1, 2001)]
    finally:
        rig.close()


INSTANT = directive(ReplaySample(validate_s=0.0, correct=False))


def test_a_flood_from_several_clients_is_answered_in_full() -> None:
    """4 clients at once, each 3,000 pings and 250 evaluations in flight together: 13,000
    requests to a real scheduler (and its 2 replaying workers), every one answered, and right."""
    clients, pings, evaluations = 4, 3000, 250
    results: dict[int, tuple[int, int, float]] = {}
    errors: list[BaseException] = []
    with LocalCluster(workers=2, evaluator="replay") as cluster:
        start = threading.Barrier(clients)

        def flood(index: int) -> None:
            try:
                with Client(cluster.address, name=f"flood{index}") as client:
                    conn = client.conn
                    start.wait()
                    t0 = time.perf_counter()
                    pongs, verdicts = [], []
                    step = (pings + evaluations) // evaluations
                    for i in range(pings + evaluations):
                        if i % step == 0 and len(verdicts) < evaluations:
                            sub = CandidateSubmission(job_id="", candidate_id=f"f{index}-{i}", problem_name="flood",
                                                      problem_source="class Model: pass\n",
                                                      candidate_source=INSTANT)
                            verdicts.append((sub.candidate_id, conn.call(
                                EvaluateRequest(call_id=0, submission=sub, stage="validate"))))
                        else:
                            payload = f"{index}:{i}".encode()
                            pongs.append((payload, conn.call(Ping(call_id=0, payload=payload))))
                    answered = 0
                    for payload, fut in pongs:
                        reply = fut.result(60)
                        assert isinstance(reply, Pong) and reply.payload == payload
                        answered += 1
                    for candidate_id, fut in verdicts:
                        reply = fut.result(60)
                        assert isinstance(reply, EvaluateReply) and reply.update.candidate_id == candidate_id
                        assert "replayed" in reply.update.verdict.flags
                        answered += 1
                    results[index] = (len(pongs) + len(verdicts), answered, time.perf_counter() - t0)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=flood, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert not errors, errors[0]
        sent = sum(r[0] for r in results.values())
        answered = sum(r[1] for r in results.values())
        print(f"flood: {sent} requests from {clients} clients, {answered} answered, "
              f"slowest client {max(r[2] for r in results.values()):.2f} s")
        assert len(results) == clients and sent == answered == clients * (pings + evaluations)
        log = (cluster.tmp / "logs" / "scheduler.log").read_text()
        assert "refused a message" not in log
