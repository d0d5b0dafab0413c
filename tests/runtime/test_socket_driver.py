"""SocketDriver: the thread that waits leads the socket, others queue their sends, the keeper drives it otherwise."""
from __future__ import annotations

import threading
import time

import pytest
import zmq

from specgen.runtime.socket_driver import SocketDriver


class Rig:
    """A driver over one end of a PAIR, the test holding the other end (`peer`)."""

    def __init__(self, ctx: zmq.Context, name: str, tick_s: float = 3600.0, keeper: bool = True) -> None:
        self.peer = ctx.socket(zmq.PAIR)
        self.peer.bind(f"inproc://{name}")
        sock = ctx.socket(zmq.PAIR)
        sock.connect(f"inproc://{name}")
        self.frames: list[tuple[bytes, int]] = []      # (frame, the thread that received it)
        self.ticks: list[int] = []
        self.got_frame, self.ticked = threading.Event(), threading.Event()
        self.driver = SocketDriver(sock, None, name, f"{name}-keeper", tick_s,
                                   self.on_frame, self.on_tick, lambda event: None)
        if keeper:
            self.driver.start()

    def on_frame(self, frame: bytes) -> None:
        self.frames.append((frame, threading.get_ident()))
        self.got_frame.set()
        if frame == b"boom":
            raise RuntimeError("a handler bug")

    def on_tick(self, now: float) -> None:
        self.ticks.append(threading.get_ident())
        if len(self.ticks) >= 3:
            self.ticked.set()

    def leading(self) -> bool:
        return self.driver._leader == threading.get_ident()

    def close(self) -> None:
        self.driver.shut(lambda: None)
        self.driver.close()


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def test_the_keeper_delivers_messages_and_ticks_while_no_thread_waits(ctx: zmq.Context) -> None:
    rig = Rig(ctx, "keeper", tick_s=0.01)
    try:
        rig.peer.send(b"unasked")
        assert rig.got_frame.wait(10) and rig.ticked.wait(10)
        keeper = rig.driver._keeper.ident
        assert rig.frames == [(b"unasked", keeper)] and set(rig.ticks) == {keeper}
        rig.driver.send([b"from", b"anyone"])             # the keeper leads: queued, sent by it
        assert rig.peer.poll(10_000) and rig.peer.recv_multipart() == [b"from", b"anyone"]
    finally:
        rig.close()


def test_a_waiting_thread_takes_the_socket_over_and_receives_on_its_own_thread(ctx: zmq.Context) -> None:
    rig = Rig(ctx, "leader", tick_s=0.01)
    try:
        assert rig.ticked.wait(10)                        # the keeper has driven it
        me, sent = threading.get_ident(), []

        def done() -> bool:
            if rig.leading() and not sent:                # once this thread leads, the answer comes
                rig.peer.send(b"reply")
                sent.append(True)
            return any(f == b"reply" for f, _ in rig.frames)

        rig.driver.drive(done, timeout=10)
        assert sent and rig.frames[-1] == (b"reply", me)
        assert rig.driver._leader != me                   # let go on return
    finally:
        rig.close()


def test_what_other_threads_send_while_one_leads_goes_out_through_the_leader(ctx: zmq.Context) -> None:
    rig = Rig(ctx, "queue", keeper=False)
    try:
        received: list[list[bytes]] = []
        sent: list[bool] = []

        def done() -> bool:
            if rig.leading() and not sent:
                sent.append(True)
                sender = threading.Thread(target=rig.driver.send, args=([b"queued", b"by another"],))
                sender.start()
                sender.join()                             # never blocks: queued and the leader woken
                assert list(rig.driver._out) == [[b"queued", b"by another"]]
            if rig.peer.poll(0):
                received.append(rig.peer.recv_multipart())
            return bool(received)

        rig.driver.drive(done, timeout=10)
        assert received == [[b"queued", b"by another"]] and not rig.driver._out
    finally:
        rig.close()


def test_drive_returns_at_its_timeout_and_sends_directly_when_nobody_leads(ctx: zmq.Context) -> None:
    rig = Rig(ctx, "timeout", keeper=False)
    try:
        started = time.monotonic()
        rig.driver.drive(lambda: False, timeout=0.2)
        assert time.monotonic() - started >= 0.2 and rig.driver._leader is None
        rig.driver.send([b"direct"])                      # free: sent from the calling thread
        assert rig.peer.poll(0) and rig.peer.recv() == b"direct"
    finally:
        rig.close()


def test_a_failing_handler_does_not_stop_the_messages_after_it(ctx: zmq.Context) -> None:
    rig = Rig(ctx, "boom", keeper=False)
    try:
        rig.peer.send(b"boom")
        rig.peer.send(b"after")
        rig.driver.drive(lambda: len(rig.frames) == 2, timeout=10)
        assert [f for f, _ in rig.frames] == [b"boom", b"after"]
    finally:
        rig.close()


def test_shutting_ends_every_wait_and_close_sends_what_was_queued(ctx: zmq.Context) -> None:
    rig = Rig(ctx, "shut", keeper=False)
    leading, returned = threading.Event(), threading.Event()

    def wait_forever() -> None:
        rig.driver.drive(lambda: (leading.set() if rig.leading() else None) or False)
        returned.set()

    waiter = threading.Thread(target=wait_forever)
    waiter.start()
    assert leading.wait(10)
    rig.driver.send([b"last words"])                      # queued for the leader
    closing = []
    assert rig.driver.shut(lambda: closing.append(rig.driver.closed))
    assert closing == [False] and rig.driver.closed
    assert not rig.driver.shut(lambda: closing.append("again")) and closing == [False]
    assert returned.wait(10)
    waiter.join()
    rig.driver.close()
    rig.driver.send([b"after close"])                     # dropped, not raised
    assert rig.peer.poll(5000) and rig.peer.recv() == b"last words"
    assert not rig.peer.poll(100)
