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

A request in flight when a timing comes gives way (`give_way`): the judge waiting for its reply
polls every 0.1 s, and when a timing waits it stops the request's runner (SIGSTOP), lets its
shared hold go, and takes it back once the timing is done, then lets the runner go on. Otherwise
a timing would wait for the longest request in flight (a Triton compile inside a first call, a
`torch.compile` load, a 1 GB comparison: seconds), and every other worker's new requests with it,
since the waiting timing holds the gate. What a stopped runner had already queued on the GPU
still runs; it is what a request's last kernels take (milliseconds), and the timing's warm-up
calls come first.

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
import time
from pathlib import Path
from typing import Callable, Iterator


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
        self._sharing = False           # this worker's shared hold
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
        self._sharing = True
        try:
            yield
        finally:
            self._sharing = False
            fcntl.flock(lock, fcntl.LOCK_UN)

    def timing_waits(self) -> bool:
        """Whether another worker's timing holds the gate (waiting for the lock, or timing).
        False inside this worker's own timing: its gate is this worker's then, and a probe of
        the same open file would release it."""
        if self._fds is None or self._held:
            return False
        gate = self._fds[0]
        try:
            fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True        # a timing (or, for an instant, a request passing the gate)
        fcntl.flock(gate, fcntl.LOCK_UN)
        return False

    def give_way(self, pause: Callable[[], None], resume: Callable[[], None]) -> float:
        """Inside a shared hold, while a request is in flight: when another worker's timing
        waits, stop the request's processes (`pause`), let the timing have the GPU, take the
        shared hold back after it and `resume`. Returns the seconds given (0.0 when no timing
        waits)."""
        if not self._sharing or not self.timing_waits():
            return 0.0
        gate, lock = self._fds           # type: ignore[misc]
        began = time.perf_counter()
        pause()
        try:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_EX)   # behind the timing, as a new request would be
            fcntl.flock(gate, fcntl.LOCK_UN)
            fcntl.flock(lock, fcntl.LOCK_SH)
        finally:
            resume()
        return time.perf_counter() - began

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
