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
        _, hb = fake.recv(Heartbeat)        # heartbeats flow from the I/O thread
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
        fut = conn.call(Ping(call_id=0))
        _, ping = fake.recv(Ping)
        fake.send(peer, Pong(call_id=ping.call_id))
        fut.result(2)
    finally:
        conn.close()
