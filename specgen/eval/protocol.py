"""Framing of the pipes between an evaluation worker and its own runner subprocesses.

These never leave the host: a worker writes one job to a runner it started and reads one result
back over a pipe pair. The frames are the typed structs of `specgen.messages` (section
"evaluation runners") as msgpack with a 4-byte little-endian length in front; decoding is strict.
The ZeroMQ framing of `specgen.runtime.wire` is not used here: its header carries a message kind
and protocol version, which a pipe whose every frame's struct follows from its place in the
exchange does not need, and the runtime sits above the evaluation service.
"""
from __future__ import annotations

import os
import select
import struct
import time

import msgspec

_HEADER = struct.Struct("<I")
MAX_FRAME = 256 * 1024 * 1024


class FrameError(ValueError):
    """A frame from the other end of the pipe that cannot be accepted: too large, or not the
    struct expected (the message names which and what is wrong)."""


_encoder = msgspec.msgpack.Encoder()


def write_frame(fd: int, message: msgspec.Struct) -> None:
    data = _encoder.encode(message)
    payload = _HEADER.pack(len(data)) + data
    view = memoryview(payload)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class FrameReader:
    """Reads length-prefixed frames from a pipe with deadlines (no thread needed)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = bytearray()
        self.eof = False

    def _fill(self, deadline: float | None) -> bool:
        """Read what is available; False on timeout. Sets `eof` when the writer is gone."""
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            self.eof = True
        self._buffer += chunk
        return True

    def read(self, kind: type[msgspec.Struct], deadline: float | None = None
             ) -> msgspec.Struct | None:
        """One frame of `kind`, or None on timeout/EOF (check `eof`); FrameError for a bad one."""
        while True:
            if len(self._buffer) >= _HEADER.size:
                (size,) = _HEADER.unpack_from(self._buffer)
                if size > MAX_FRAME:
                    raise FrameError(f"frame of {size} bytes exceeds {MAX_FRAME}")
                if len(self._buffer) >= _HEADER.size + size:
                    data = bytes(self._buffer[_HEADER.size:_HEADER.size + size])
                    del self._buffer[:_HEADER.size + size]
                    try:
                        return msgspec.msgpack.decode(data, type=kind)
                    except msgspec.DecodeError as exc:   # ValidationError is one too
                        raise FrameError(f"bad {kind.__name__} frame: {exc}") from None
                    except RecursionError:
                        raise FrameError(f"bad {kind.__name__} frame: nested too deeply") from None
            if self.eof:
                return None
            if deadline is not None and time.monotonic() >= deadline:
                return None
            if not self._fill(deadline):
                return None
