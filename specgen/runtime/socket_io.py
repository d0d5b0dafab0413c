"""One message in or out of a ZeroMQ socket at the least cost per call, shared by every actor's
loop: the Cython socket's own send and receive, without blocking.
"""
from __future__ import annotations

import zmq

# zmq.POLLIN as a plain int: `&` with the enum member builds a new enum object each time.
POLLIN = int(zmq.POLLIN)
# The Cython socket's own send and recv: pyzmq's Python wrappers (send_multipart, the sugar
# Socket.send) cost as much again per call, and a round trip makes a dozen of them.
recv_frame = zmq.backend.Socket.recv
_send_frame = zmq.backend.Socket.send
NOBLOCK = int(zmq.NOBLOCK)
_MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)


def send_frames(sock: zmq.Socket, frames: list) -> None:
    """Send one message without blocking; raises zmq.ZMQError (Again at the high-water mark,
    EHOSTUNREACH for an unknown peer on a ROUTER_MANDATORY socket)."""
    for frame in frames[:-1]:
        _send_frame(sock, frame, _MORE_NOBLOCK)
    _send_frame(sock, frames[-1], NOBLOCK)
