"""Frames between an evaluation worker and its own runner subprocesses.

These never leave the host: a worker writes one job to a runner it started and reads one result
back over a pipe pair. They are typed msgspec structs encoded as length-prefixed msgpack, like every
other frame in specgen (the network-facing ones live in `specgen.messages`); decoding is strict.
"""
from __future__ import annotations

import os
import select
import struct
import time

import msgspec

from specgen.eval.options import EvalOptions
from specgen.messages import Verdict

_HEADER = struct.Struct("<I")
MAX_FRAME = 256 * 1024 * 1024


class FrameError(ValueError):
    """A frame from the other end of the pipe that cannot be accepted: too large, or not the
    struct expected (the message names which and what is wrong)."""


class RunnerReady(msgspec.Struct, kw_only=True):
    """First frame of every runner: imports done, device context live."""

    pid: int
    device: str                          # device as the runner sees it ("cpu" or "cuda:0")
    device_name: str                     # e.g. "NVIDIA H200" or the CPU model
    capability: str = ""                 # CUDA compute capability "9.0"; "" on CPU
    torch_version: str = ""
    triton_version: str = ""
    startup_s: float = 0.0               # interpreter start to ready


class RefTiming(msgspec.Struct, kw_only=True):
    """A reference timing, cached per problem source, device and timing settings."""

    ref_ms: float
    ref_spread: float
    ref_compiled_ms: float | None = None
    samples: int = 0


class RunJob(msgspec.Struct, kw_only=True):
    """One candidate to evaluate, sent to a ready runner (which then exits)."""

    stage: str                           # "validate" | "profile" | "full" | "reference"
    problem_source: str
    problem_name: str
    candidate_source: str
    options: EvalOptions
    reported_device: str                 # the device name verdicts carry ("cuda:1")
    job_dir: str                         # scratch space for this candidate
    cache_dir: str                       # shared build/timing cache
    build_dir: str                       # this worker's own build directory
    ref_timing: RefTiming | None = None  # cached reference timing, when there is one


class RunResult(msgspec.Struct, kw_only=True):
    verdict: Verdict
    ref_timing: RefTiming | None = None  # a reference timing measured by this run (to cache)


class BuildJob(msgspec.Struct, kw_only=True):
    """Execute a candidate's module once so that its load_inline extensions get built."""

    candidate_source: str
    cache_dir: str
    build_dir: str


class BuildRecord(msgspec.Struct, kw_only=True):
    name: str                            # the extension's name as the candidate gave it
    key: str                             # hash of the load_inline arguments
    ok: bool
    seconds: float = 0.0
    cached: bool = False                 # found in the cache, nothing compiled
    error: str | None = None
    library: str = ""                    # path of the built library in the build directory


class BuildResult(msgspec.Struct, kw_only=True):
    records: list[BuildRecord] = []
    module_error: str | None = None      # the module raised after (or without) its builds
    seconds: float = 0.0


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
