"""PeerConnection against a hand-driven ROUTER: handshake, timeouts, re-registration."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq

from specgen.messages import (
    ErrorReply, GetStats, Heartbeat, HeartbeatAck, Hello, Ping, Pong, Welcome,
)
from specgen.runtime import wire
from specgen.runtime.settings import RuntimeSettings
from specgen.runtime.transport import CallTimeout, PeerConnection, RemoteError, SchedulerUnreachable

from tests.runtime.conftest import wait_for

SETTINGS = RuntimeSettings(heartbeat_interval_s=0.1, peer_timeout_s=1.0, connect_timeout_s=1.0,
                           call_timeout_s=1.0)


class FakeScheduler:
    def __init__(self, address: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.RCVTIMEO, 3000)
        self.sock.bind(address)

    def recv(self, kind: type | None = None, timeout: float = 10.0):
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:     # heartbeats keep arriving: bound the whole wait
                raise AssertionError(f"no {kind.__name__ if kind else 'message'} within {timeout} s")
            peer, *frames = self.sock.recv_multipart()
            msg = wire.decode(frames, 1 << 20)
            if kind is None or isinstance(msg, kind):
                return peer, msg

    def send(self, peer: bytes, msg) -> None:
        self.sock.send_multipart([peer, *wire.encode(msg)])

    def welcome(self, scheduler_id: str = "s1") -> bytes:
        peer, hello = self.recv(Hello)
        assert hello.role == "client"
        self.send(peer, Welcome(scheduler_id=scheduler_id, heartbeat_interval_s=0.1, peer_timeout_s=1.0,
                                max_message_bytes=1 << 20))
        return peer

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def fake(tmp_path: Path):
    f = FakeScheduler(f"ipc://{tmp_path}/fake.sock")
    f.address = f"ipc://{tmp_path}/fake.sock"
    yield f
    f.close()


def connected(fake: FakeScheduler, scheduler_id: str = "s1", **kw) -> tuple[PeerConnection, bytes]:
    """A connection the fake scheduler has welcomed, and the peer id to answer it at."""
    conn = PeerConnection(fake.address, "client", "c", SETTINGS, **kw).start()
    peer = fake.welcome(scheduler_id)
    conn.wait_welcome()
    return conn, peer


def answered_ping(conn: PeerConnection, fake: FakeScheduler, peer: bytes) -> None:
    """A ping the fake scheduler answers; the next message it receives must be that ping."""
    fut = conn.call(Ping(call_id=0))
    _, ping = fake.recv(Ping)
    fake.send(peer, Pong(call_id=ping.call_id))
    fut.result(2)


def test_no_welcome_names_the_setting(tmp_path: Path) -> None:
    conn = PeerConnection(f"ipc://{tmp_path}/nobody.sock", "client", "c", SETTINGS).start()
    try:
        with pytest.raises(SchedulerUnreachable, match="connect_timeout_s"):
            conn.wait_welcome()
    finally:
        conn.close()


def test_requests_replies_errors_and_timeouts(fake: FakeScheduler) -> None:
    conn = PeerConnection(fake.address, "client", "c", SETTINGS).start()
    try:
        peer = fake.welcome()
        assert conn.wait_welcome().scheduler_id == "s1"
        fut = conn.call(Ping(call_id=0, payload=b"a"))
        _, ping = fake.recv(Ping)
        fake.send(peer, Pong(call_id=ping.call_id, payload=b"a"))
        assert fut.result(2).payload == b"a"
        fut = conn.call(GetStats(call_id=0))
        _, req = fake.recv(GetStats)
        fake.send(peer, ErrorReply(code="busy", message="later", ref=req.call_id))
        with pytest.raises(RemoteError, match="busy: later"):
            fut.result(2)
        with pytest.raises(CallTimeout, match="call_timeout_s"):
            conn.request(Ping(call_id=0), timeout=0.3)
        _, hb = fake.recv(Heartbeat)        # heartbeats flow while nobody waits (the keeper)
        assert hb.sent_at > 0
    finally:
        conn.close()


def test_unanswered_requests_are_resent_after_re_registration(fake: FakeScheduler) -> None:
    reconnects = []
    conn = PeerConnection(fake.address, "client", "c", SETTINGS,
                          on_reconnect=lambda: reconnects.append(1)).start()
    try:
        peer = fake.welcome("s1")
        conn.wait_welcome()
        fut = conn.call(Ping(call_id=0, payload=b"lost"))
        _, first = fake.recv(Ping)
        # The scheduler restarts before answering: it no longer knows us.
        fake.send(peer, HeartbeatAck(scheduler_id="s2"))
        peer = fake.welcome("s2")
        _, again = fake.recv(Ping)
        assert again.call_id == first.call_id and again.payload == b"lost"
        fake.send(peer, Pong(call_id=again.call_id, payload=b"lost"))
        assert fut.result(2).payload == b"lost"
        assert reconnects == [1]
        # An "unregistered" refusal also leads to Hello and a re-send.
        fut = conn.call(Ping(call_id=0, payload=b"two"))
        _, p2 = fake.recv(Ping)
        fake.send(peer, ErrorReply(code="unregistered", message="say hello", ref=p2.call_id))
        peer = fake.welcome("s2")
        _, p2b = fake.recv(Ping)
        assert p2b.call_id == p2.call_id
        fake.send(peer, Pong(call_id=p2b.call_id))
        fut.result(2)
        # Timed out by a scheduler that did not restart: streams are picked up again too.
        assert reconnects == [1, 1]
    finally:
        conn.close()


def test_dead_notice_fails_waiting_calls_at_once_until_a_new_scheduler_answers(fake: FakeScheduler) -> None:
    from specgen.messages import DeadNotice
    from specgen.runtime.transport import SchedulerFailed

    conn = PeerConnection(fake.address, "client", "c", SETTINGS).start()
    try:
        peer = fake.welcome("s1")
        conn.wait_welcome()
        waiting = conn.call(Ping(call_id=0))
        fake.recv(Ping)
        fake.send(peer, DeadNotice(name="scheduler", reason="RuntimeError: disk full"))
        with pytest.raises(SchedulerFailed, match="disk full"):
            waiting.result(2)
        with pytest.raises(SchedulerFailed):
            conn.call(Ping(call_id=0)).result(2)
        fake.send(peer, HeartbeatAck(scheduler_id="s2"))     # a restarted scheduler
        peer = fake.welcome("s2")
        wait_for(lambda: conn.scheduler_failure is None, 10, "the new Welcome to be handled")
        answered_ping(conn, fake, peer)
    finally:
        conn.close()


def test_a_waiting_thread_leads_and_other_threads_still_send_and_get_replies(fake: FakeScheduler) -> None:
    """One thread waits for a slow reply (it drives the socket); meanwhile another thread's request
    goes out at once and its reply reaches it, and the first thread still gets its own."""
    import threading

    conn, peer = connected(fake)
    try:
        first: dict = {}
        waiter = threading.Thread(target=lambda: first.update(r=conn.request(Ping(call_id=0, payload=b"slow"), 10)))
        waiter.start()
        _, slow = fake.recv(Ping)
        assert slow.payload == b"slow"
        t0 = time.monotonic()
        fut = conn.call(Ping(call_id=0, payload=b"quick"))     # sent while the waiter leads
        _, quick = fake.recv(Ping)
        assert quick.payload == b"quick" and time.monotonic() - t0 < 1.0
        fake.send(peer, Pong(call_id=quick.call_id, payload=b"quick"))
        assert fut.result(5).payload == b"quick"                 # delivered by the leading thread
        assert waiter.is_alive()
        fake.send(peer, Pong(call_id=slow.call_id, payload=b"slow"))
        waiter.join(5)
        assert first["r"].payload == b"slow"
    finally:
        conn.close()


def test_two_threads_waiting_at_once_each_get_their_reply(fake: FakeScheduler) -> None:
    import threading

    conn, peer = connected(fake)
    try:
        got: dict = {}
        threads = [threading.Thread(target=lambda n=n: got.update({n: conn.request(Ping(call_id=0, payload=n), 10)}))
                   for n in (b"a", b"b")]
        for t in threads:
            t.start()
        pings = [fake.recv(Ping)[1] for _ in threads]
        for p in reversed(pings):      # answer the later one first: the follower's reply comes first
            fake.send(peer, Pong(call_id=p.call_id, payload=p.payload))
        for t in threads:
            t.join(5)
        assert {k: v.payload for k, v in got.items()} == {b"a": b"a", b"b": b"b"}
    finally:
        conn.close()


def test_messages_nobody_waits_for_are_delivered_by_the_keeper(fake: FakeScheduler) -> None:
    from specgen.messages import CancelWork

    seen: list = []
    conn, peer = connected(fake, on_message=seen.append)
    try:
        fake.send(peer, CancelWork(request_id="r1"))
        wait_for(lambda: seen, 5, "the keeper to deliver the message")
        assert seen[0].request_id == "r1"
        answered_ping(conn, fake, peer)        # and a waiting thread takes the socket back
    finally:
        conn.close()


def test_close_fails_a_waiting_request_at_once(fake: FakeScheduler) -> None:
    import threading

    from specgen.runtime.transport import RuntimeFailure

    conn, peer = connected(fake)
    errors: list = []

    def wait() -> None:
        try:
            conn.request(Ping(call_id=0), 30)
        except RuntimeFailure as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    fake.recv(Ping)
    t0 = time.monotonic()
    conn.close()
    waiter.join(5)
    assert errors and "closed" in str(errors[0]) and time.monotonic() - t0 < 3.0
    assert peer


def test_a_kept_result_is_re_sent_until_acknowledged(fake: FakeScheduler) -> None:
    from specgen.messages import CandidateUpdate, Verdict, WorkDone

    conn, peer = connected(fake)
    try:
        upd = CandidateUpdate(job_id="j", candidate_id="c", stage="validate", verdict=Verdict(stage="validate"))
        conn.send_kept(WorkDone(request_id="r1", update=upd))
        _, done = fake.recv(WorkDone)
        # The scheduler restarts before acknowledging: the result goes to the new one.
        fake.send(peer, HeartbeatAck(scheduler_id="s2"))
        peer = fake.welcome("s2")
        _, again = fake.recv(WorkDone)
        assert again.call_id == done.call_id and again.request_id == "r1"
        # Acknowledged in a heartbeat's ack: no longer kept, so not re-sent at the next restart.
        fake.send(peer, HeartbeatAck(scheduler_id="s2", acked=[again.call_id]))
        wait_for(lambda: not conn.calls.pending, 5, "the ack to be applied")
        fake.send(peer, HeartbeatAck(scheduler_id="s3"))
        peer = fake.welcome("s3")
        fut = conn.call(Ping(call_id=0))
        while True:                       # what follows the Hello: heartbeats, the ping, no result
            _, msg = fake.recv()
            assert not isinstance(msg, WorkDone), "an acknowledged result was sent again"
            if isinstance(msg, Ping):
                break
        fake.send(peer, Pong(call_id=msg.call_id))
        fut.result(2)
    finally:
        conn.close()


def test_a_callback_may_wait_for_a_reply_on_the_thread_that_delivered_it(fake: FakeScheduler) -> None:
    """The keeper delivers a message whose handler makes a blocking request: the handler's wait
    drives the socket from the same thread (nested), so its reply still arrives."""
    from specgen.messages import CancelWork

    replies: list = []
    holder: dict = {}

    def on_message(msg) -> None:
        if isinstance(msg, CancelWork):
            replies.append(holder["conn"].request(Ping(call_id=0, payload=b"inner"), 5))

    conn, peer = connected(fake, on_message=on_message)
    holder["conn"] = conn
    try:
        fake.send(peer, CancelWork(request_id="r1"))
        _, inner = fake.recv(Ping)
        fake.send(peer, Pong(call_id=inner.call_id, payload=b"inner"))
        wait_for(lambda: replies, 5, "the handler's request to be answered")
        assert replies[0].payload == b"inner"
    finally:
        conn.close()
