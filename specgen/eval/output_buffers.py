"""The shared buffers candidates' outputs travel in, kept by a worker from one verdict to the next.

A full comparison needs the candidate's output in the reference's runner: the candidate's runner
copies it into a sealed memfd of the judge's (`Ship`) and the reference's runner reads it there
(`Compare`). A new memfd's pages are allocated and zeroed as they are first mapped: on an H100
host a fresh 1 GiB buffer took 432 ms to map and 166 ms to copy into, one written before 31 ms
and 59 ms (`tools/output_path_bench.py`, BENCHMARKS.md), and a verdict ships up to three outputs.
A worker judges one candidate at a time, mostly a job's candidates of one problem in a row, so it
keeps its buffers (up to `keep_bytes`) for the next verdict.

A kept buffer holds the last output copied into it, and the runner that is given it next can read
it. So a buffer goes to another job, or to a one-off request (job ""), only zeroed. Within a job
what an older output could tell is nothing the job does not own, and it cannot pass for a new
one: every trial's inputs come from a fresh seed, so a stale output fails its comparison.

One worker's judge uses its pool, one verdict at a time: no locking.
"""
from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
from dataclasses import dataclass

MIN_BYTES = 1 << 20             # a buffer's smallest size: small outputs share one


def default_keep_bytes() -> int:
    """What a worker keeps between verdicts: 4 GiB, or a sixteenth of the host's memory if less
    (the pages are the host's, held while no verdict runs)."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        physical = 16 << 30
    return min(4 << 30, physical // 16)


def sealed_memfd(size: int) -> int:
    """A shared buffer of `size` bytes that no process can shrink or grow (a runner holding it
    mapped could otherwise make the other's reads fault)."""
    fd = os.memfd_create("specgen-outputs", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, max(size, 1))
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _zero(fd: int, size: int) -> None:
    """Every byte of the buffer set to 0, in place. Mapped with its pages populated in one call:
    faulting 1 GiB in page by page cost as much as a new buffer (444 ms on an H200 host);
    populated, 256 MiB take 32-34 ms on the CPU VM (a new buffer's mapping there: 149-152 ms)."""
    mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
    try:
        view = ctypes.c_char.from_buffer(mapping)
        ctypes.memset(ctypes.addressof(view), 0, size)
        del view
    finally:
        mapping.close()


@dataclass
class OutputBuffer:
    fd: int
    size: int
    owner: str | None = None        # the job whose output it may hold; None: none (zeroed, new)


class OutputBuffers:
    """A worker's pool of output buffers (see the module doc)."""

    def __init__(self, keep_bytes: int | None = None) -> None:
        self.keep_bytes = default_keep_bytes() if keep_bytes is None else keep_bytes
        self._free: list[OutputBuffer] = []     # oldest first
        self._closed = False
        self.created = 0
        self.reused = 0
        self.zeroed = 0

    def take(self, nbytes: int, owner: str) -> OutputBuffer:
        """A buffer of at least `nbytes` for a verdict of the job `owner`: the smallest kept one
        that fits (zeroed first if it may hold another's output), else a new one."""
        fits = [b for b in self._free if b.size >= nbytes]
        if not fits:
            size = max(nbytes, MIN_BYTES)
            self.created += 1
            return OutputBuffer(sealed_memfd(size), size)
        buffer = min(fits, key=lambda b: b.size)
        self._free.remove(buffer)
        self.reused += 1
        if buffer.owner is not None and (buffer.owner != owner or not owner):
            try:
                _zero(buffer.fd, buffer.size)
            except BaseException:
                os.close(buffer.fd)
                raise
            buffer.owner = None
            self.zeroed += 1
        return buffer

    def give(self, buffer: OutputBuffer, owner: str) -> None:
        """`buffer` back, having been given to a runner for the job `owner`. The oldest kept go
        first while more than `keep_bytes` are kept."""
        if buffer.fd < 0:
            return
        if self._closed:            # the worker closed while a verdict ran: nothing is kept
            os.close(buffer.fd)
            buffer.fd = -1
            return
        buffer.owner = owner
        self._free.append(buffer)
        while self._free and self.kept_bytes > self.keep_bytes:
            dropped = self._free.pop(0)
            os.close(dropped.fd)
            dropped.fd = -1

    @property
    def kept_bytes(self) -> int:
        return sum(b.size for b in self._free)

    def close(self) -> None:
        self._closed = True
        for buffer in self._free:
            os.close(buffer.fd)
            buffer.fd = -1
        self._free.clear()
