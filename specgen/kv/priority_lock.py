"""A re-entrant lock that lets a thread marked urgent go before the others.

Python's locks are not fair. A thread that releases a lock and takes it again a few microseconds
later nearly always wins over a thread that was woken meanwhile, because the woken one must first
get the interpreter back. The KV pool's lock is taken several times per load, so a thread loading
without pause (an engine fetching prefixes) kept a give-back waiting for the lock for up to ~100 ms
on the H200, while the profiling run that asked for the memory waited too.

A thread inside `urgent()` announces itself before it waits for the lock. Ordinary acquirers that
arrive meanwhile wait behind the announcement (holding neither the lock nor the interpreter) until
the urgent thread has the lock, so the next release goes to it. Nested acquisitions by a thread that
already holds the lock never wait, so re-entrant use cannot deadlock behind an announcement.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class PriorityLock:
    """`with lock:` as an RLock; `with lock.urgent():` makes this thread's acquisitions go first."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._gate = threading.Condition(threading.Lock())
        self._announced = 0             # urgent threads waiting for the lock now
        self._local = threading.local()  # per thread: depth (acquisitions held), urgent (nesting)

    @contextmanager
    def urgent(self) -> Iterator[None]:
        """Acquisitions by this thread inside the block go before ordinary ones."""
        local = self._local
        local.urgent = getattr(local, "urgent", 0) + 1
        try:
            yield
        finally:
            local.urgent -= 1

    def acquire(self) -> None:
        local = self._local
        depth = getattr(local, "depth", 0)
        if depth:
            self._lock.acquire()        # already held by this thread: re-entry never waits
        elif getattr(local, "urgent", 0):
            with self._gate:
                self._announced += 1
            try:
                self._lock.acquire()
            finally:
                with self._gate:
                    self._announced -= 1
                    if not self._announced:
                        self._gate.notify_all()
        else:
            # Unlocked read first: the common case (no give-back) costs one attribute load.
            if self._announced:
                with self._gate:
                    self._gate.wait_for(lambda: not self._announced)
            self._lock.acquire()
        local.depth = depth + 1

    def release(self) -> None:
        self._local.depth -= 1
        self._lock.release()

    def __enter__(self) -> "PriorityLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
