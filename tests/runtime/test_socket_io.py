"""The frame primitives every actor's loop uses: send a message without blocking, receive one frame."""
from __future__ import annotations

import pytest
import zmq

from specgen.runtime.socket_io import NOBLOCK, POLLIN, recv_frame, send_frames


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def test_a_message_of_several_frames_arrives_whole_and_in_order(ctx: zmq.Context) -> None:
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://frames")
    b.connect("inproc://frames")
    send_frames(a, [b"one", b"two", memoryview(b"three")])
    send_frames(a, [b"single"])
    assert b.poll(5000) & POLLIN
    assert b.recv_multipart() == [b"one", b"two", b"three"]
    assert recv_frame(b, NOBLOCK) == b"single"
    with pytest.raises(zmq.Again):                     # nothing left: no blocking
        recv_frame(b, NOBLOCK)
    assert not b.getsockopt(zmq.EVENTS) & POLLIN


def test_a_router_receives_the_senders_id_then_its_frame(ctx: zmq.Context) -> None:
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"peer-1")
    router.bind("inproc://router")
    dealer.connect("inproc://router")
    send_frames(dealer, [b"hello"])
    assert router.poll(5000) & POLLIN
    assert (recv_frame(router, NOBLOCK), recv_frame(router, NOBLOCK)) == (b"peer-1", b"hello")
    send_frames(router, [b"peer-1", b"back"])
    assert dealer.poll(5000) & POLLIN and recv_frame(dealer, NOBLOCK) == b"back"


def test_sending_never_blocks_it_raises_instead(ctx: zmq.Context) -> None:
    lonely = ctx.socket(zmq.DEALER)                    # no peer: nowhere to queue the message
    with pytest.raises(zmq.Again):
        send_frames(lonely, [b"x"])
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.bind("inproc://mandatory")
    with pytest.raises(zmq.ZMQError) as err:
        send_frames(router, [b"nobody", b"x"])
    assert err.value.errno == zmq.EHOSTUNREACH
