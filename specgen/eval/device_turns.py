"""Workers that share one GPU take turns to time it.

Several evaluation workers may share a large GPU (`specgen-node --gpus 0,0,0,0`): their candidates'
compiles, loads and correctness calls overlap, which is where most of a verdict's time goes. Their
timings must not: a kernel of another worker running beside a timed call slows it, and a slowed
reference timing (cached per problem and device) would inflate every later speedup measured
against it. So, per physical GPU of the host, a reader-writer lock:

* every request a judge sends outside its timing (load, correctness, probes, the reference's load)
  holds the lock shared, so many run at once;
* a judge's timing (the reference's and the candidate's, with their calls of nothing) holds it
  exclusive, so no other worker's request is in flight while it times.

A candidate runner can also work between requests (a thread it started, kernels it queued):
`Judge` stops a candidate runner's processes whenever it has no request of theirs outstanding
(see `Runner.pause`), so while one worker times, every other worker's candidate is stopped or
waiting for its turn.

The lock is `flock(2)` on files in /dev/shm (or the temporary directory), one pair per GPU: a gate
that a waiting writer holds, so that a stream of shared holders cannot keep a timing waiting, and
the lock itself. flock locks belong to an open file, so each `DeviceTurns` opens its own: two
workers in one process exclude each other as two processes do. The key is the GPU's index on the
host (`CUDA_VISIBLE_DEVICES` mapped back), so that nodes of one host with different visible sets
still meet on the same files. CPU workers take no turns (they have no shared device to time).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path
from typing import Iterator


def host_gpu(device: str) -> str | None:
    """The host-wide name of `device` ("cuda:1" with CUDA_VISIBLE_DEVICES=4,5 is "5"), or None
    for the CPU."""
    if not device.startswith("cuda:"):
        return None
    index = int(device.split(":", 1)[1])
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if v.strip()]
    return visible[index] if index < len(visible) else str(index)


def _lock_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class DeviceTurns:
    """One worker's side of its GPU's lock (see the module doc), used by one thread at a time
    (a worker's judge). A shared hold inside the worker's own exclusive hold is a no-op: a flock
    of the same file would turn the exclusive lock into a shared one."""

    def __init__(self, device: str, directory: Path | None = None) -> None:
        self.gpu = host_gpu(device)
        self._fds: tuple[int, int] | None = None
        self._held = False              # this worker's own exclusive hold
        if self.gpu is None:
            return
        base = (directory or _lock_dir()) / f"specgen-gpu-{self.gpu}"
        self._fds = tuple(os.open(f"{base}.{part}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
                          for part in ("gate", "lock"))       # type: ignore[assignment]

    @property
    def active(self) -> bool:
        return self._fds is not None

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """A request that may run beside other workers' requests, never beside their timing."""
        if self._fds is None or self._held:
            yield
            return
        gate, lock = self._fds
        fcntl.flock(gate, fcntl.LOCK_EX)       # past any timing that is waiting
        fcntl.flock(gate, fcntl.LOCK_UN)
        fcntl.flock(lock, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Timing: nothing of another worker runs on the GPU meanwhile."""
        if self._fds is None or self._held:
            yield
            return
        gate, lock = self._fds
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX)
        self._held = True
        try:
            yield
        finally:
            self._held = False
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fds is not None:
            for fd in self._fds:
                os.close(fd)
            self._fds = None
