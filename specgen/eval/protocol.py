"""The channel between the judge and one runner: a SOCK_SEQPACKET socket pair on one host.

Each message is one struct of `specgen.messages.runners`: `RunnerRequest` one way,
`RunnerReply` the other, as msgpack, decoded strictly. A message longer than one packet travels
as several (a first byte says whether more follow). A SOCK_SEQPACKET socket, not a pipe, because:

* file descriptors travel with a message (SCM_RIGHTS): the shared output buffer, and a runner's
  end of its own channel on its way through the template;
* the judge's end asks the kernel to timestamp every packet it receives (SO_TIMESTAMPNS), so a
  reply's arrival time is the moment the runner sent it, whatever the judge's thread was doing
  (on a busy host, waking the judge takes up to milliseconds); the runner cannot set that stamp;
* the kernel tells who sent a packet (SO_PASSCRED): how the judge learns a sandboxed runner's pid
  in its own PID namespace.

Host-local only; the ZeroMQ framing of `specgen.runtime.wire` is not used here: the runtime sits
above the evaluation service, and no message kind or version byte is needed on a channel whose
two ends are always the same program.
"""
from __future__ import annotations

import array
import os
import select
import socket
import struct
import time
from typing import Any

import msgspec

from specgen.errors import SpecgenError
from specgen.messages import RunnerReply, RunnerRequest

PACKET = 64 * 1024              # payload bytes per packet (well under the socket's buffer)
MAX_MESSAGE = 512 * 1024 * 1024  # a message larger than this is refused
MAX_FDS = 4                     # descriptors one message may carry (and one packet)
_MORE, _LAST = b"\x01", b"\x00"
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)   # same value on x86-64 and arm64
_SCM_TIMESTAMPNS = _SO_TIMESTAMPNS
_TIMESPEC = struct.Struct("qq")
_UCRED = struct.Struct("iII")


def _ancillary_space(stamped: bool, credentials: bool) -> int:
    """Room for exactly what this end asked for and MAX_FDS descriptors. The kernel writes the
    timestamp and the credentials before the descriptors and installs only the descriptors that
    fit (dropping the rest, MSG_CTRUNC): room left over would let a packet put more into this
    process."""
    return ((socket.CMSG_SPACE(_TIMESPEC.size) if stamped else 0)
            + (socket.CMSG_SPACE(_UCRED.size) if credentials else 0)
            + socket.CMSG_SPACE(MAX_FDS * 4))


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class FrameError(SpecgenError, ValueError):
    """A message from the other end that cannot be accepted: too large, or not a struct of the
    expected union (the text names which and what is wrong)."""


class ChannelClosed(SpecgenError, ConnectionError):
    """The other end is gone (it exited or closed its socket)."""


_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(RunnerRequest)
_reply_decoder = msgspec.msgpack.Decoder(RunnerReply)


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """(judge end, runner end), both close-on-exec; pass the runner's end on explicitly."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


class Received:
    """One message with what came with it."""

    __slots__ = ("message", "fds", "stamp_ns", "sender_pid")

    def __init__(self, message: Any, fds: list[int], stamp_ns: int | None,
                 sender_pid: int | None) -> None:
        self.message = message
        self.fds = fds                  # file descriptors sent with it (the receiver owns them)
        self.stamp_ns = stamp_ns        # CLOCK_REALTIME when its last packet was sent, if stamped
        self.sender_pid = sender_pid    # the sender's pid in the receiver's namespace, if asked


class _Partial:
    """The packets of one message received so far, with what came with them."""

    __slots__ = ("parts", "fds", "stamp", "pid", "size")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.fds: list[int] = []
        self.stamp: int | None = None
        self.pid: int | None = None
        self.size = 0

    def close(self) -> None:
        close_fds(self.fds)
        self.fds = []


class Channel:
    """One end. `role="judge"` decodes replies and timestamps them; `role="runner"` decodes
    requests. Not thread-safe: one thread sends, one receives (they may differ)."""

    def __init__(self, sock: socket.socket, role: str) -> None:
        self.sock = sock
        self.role = role
        self._decoder = _reply_decoder if role == "judge" else _request_decoder
        self._partial: _Partial | None = None    # a message whose later packets are still due
        self._ancillary = _ancillary_space(role == "judge", False)
        if role == "judge":
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        if self._partial is not None:
            self._partial.close()
            self._partial = None
        try:
            self.sock.close()
        except OSError:
            pass

    def want_credentials(self, on: bool) -> None:
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1 if on else 0)
        except OSError:
            return        # closed meanwhile: there is nothing more to receive
        self._ancillary = _ancillary_space(self.role == "judge", on)

    # ------------------------------------------------------------------ sending
    def send(self, message: msgspec.Struct, fds: tuple[int, ...] = ()) -> int:
        """Send one message; returns CLOCK_REALTIME in ns taken just before its last packet went.

        A trial's clock starts there: the request is a single packet, so the runner cannot have
        it before that moment."""
        data = _encoder.encode(message)
        if len(data) > MAX_MESSAGE:
            raise FrameError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE}")
        view = memoryview(data)
        first = True
        try:
            while True:
                chunk, view = view[:PACKET], view[PACKET:]
                head = _MORE if len(view) else _LAST
                ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] \
                    if first and fds else []
                if not len(view):
                    began = time.clock_gettime_ns(time.CLOCK_REALTIME)
                self.sock.sendmsg([head, chunk], ancillary)
                first = False
                if not len(view):
                    return began
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ChannelClosed(f"the other end is gone ({exc})") from None

    # ------------------------------------------------------------------ receiving
    def recv(self, deadline: float | None = None, spin_s: float = 0.0,
             max_fds: int | None = None) -> Received | None:
        """The next message, or None at `deadline` (time.monotonic()). `spin_s`: poll without
        sleeping for that long first (a runner waiting for its next timed call: waking from a
        blocking read costs tens of microseconds, and a candidate could spin to avoid it).
        `max_fds`: how many descriptors the caller takes with this message (None: up to
        MAX_FDS); any others are closed as they arrive, so that a peer cannot fill this
        process's descriptor table (a runner sent 4 with every packet and left the worker
        holding 5,210).

        A deadline that falls between the packets of one message keeps those read so far: the
        next call goes on with that message rather than taking its middle for a new one (a judge
        polls a runner in short deadlines while a large reply, a built library, arrives)."""
        keep = MAX_FDS if max_fds is None else max(0, min(max_fds, MAX_FDS))
        partial = self._partial or _Partial()
        self._partial = None
        if len(partial.fds) > keep:        # kept by an earlier call that took more
            close_fds(partial.fds[keep:])
            del partial.fds[keep:]
        spin_until = time.monotonic() + spin_s if spin_s > 0 else 0.0
        while True:
            try:
                packet = self._packet(deadline, spin_until)
            except BaseException:
                partial.close()
                raise
            if packet is None:
                if partial.parts:
                    self._partial = partial
                else:
                    partial.close()
                return None
            data, more, got_fds, got_stamp, got_pid = packet
            room = keep - len(partial.fds)
            close_fds(got_fds[room:])
            partial.fds += got_fds[:room]
            partial.stamp = got_stamp if got_stamp is not None else partial.stamp
            partial.pid = got_pid if got_pid is not None else partial.pid
            partial.size += len(data)
            if partial.size > MAX_MESSAGE:
                partial.close()
                raise FrameError(f"message exceeds {MAX_MESSAGE} bytes")
            partial.parts.append(data)
            if not more:
                break
        try:
            message = self._decoder.decode(b"".join(partial.parts))
        except msgspec.DecodeError as exc:   # ValidationError is one too
            partial.close()
            raise FrameError(f"bad message from the {'runner' if self.role == 'judge' else 'judge'}: "
                             f"{exc}") from None
        except RecursionError:
            partial.close()
            raise FrameError("bad message: nested too deeply") from None
        return Received(message, partial.fds, partial.stamp, partial.pid)

    def _packet(self, deadline: float | None, spin_until: float
                ) -> tuple[bytes, bool, list[int], int | None, int | None] | None:
        while True:
            if not spin_until:
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                ready, _, _ = select.select([self.sock], [], [], timeout)
                if not ready:
                    return None
            try:
                data, ancillary, msg_flags, _ = self.sock.recvmsg(
                    PACKET + 1, self._ancillary, socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
            except BlockingIOError:
                if spin_until and time.monotonic() >= spin_until:
                    spin_until = 0.0
                # Spinning, but not against a process that has work on this core: the other
                # runner's timed call on a host with few cores.
                os.sched_yield()
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                continue
            except ConnectionResetError:
                raise ChannelClosed("the other end is gone") from None
            fds: list[int] = []
            stamp = pid = None
            for level, kind, payload in ancillary:
                if level != socket.SOL_SOCKET:
                    continue
                if kind == socket.SCM_RIGHTS:
                    count = len(payload) // 4
                    fds += list(struct.unpack(f"{count}i", payload[:count * 4]))
                elif kind == _SCM_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
                    seconds, nanos = _TIMESPEC.unpack_from(payload)
                    stamp = seconds * 1_000_000_000 + nanos
                elif kind == socket.SCM_CREDENTIALS and len(payload) >= _UCRED.size:
                    pid = _UCRED.unpack_from(payload)[0]
            if msg_flags & socket.MSG_TRUNC:
                close_fds(fds)
                raise FrameError(f"a packet longer than the channel's {PACKET + 1} bytes")
            if msg_flags & socket.MSG_CTRUNC or len(fds) > MAX_FDS:
                close_fds(fds)
                raise FrameError("a message carried more file descriptors than allowed")
            if not data:
                close_fds(fds)      # an empty packet may carry descriptors too
                raise ChannelClosed("the other end closed the channel")
            if len(data) > PACKET + 1 or data[:1] not in (_MORE, _LAST):
                close_fds(fds)
                raise FrameError("a packet without a valid header")
            return data[1:], data[:1] == _MORE, fds, stamp, pid
