"""Who drives a `PeerConnection`'s socket (transport.py): leader/followers, and the keeper thread.

The socket is driven by whichever thread waits on it: a thread waiting for a reply, or a worker
waiting for its next task, polls the socket itself and hands what arrives to the connection, so a
reply reaches the waiting thread with no hand-over. A keeper thread takes the socket over when no
thread has driven it for `KEEPER_TAKEOVER_S` (a worker evaluating, a client whose caller waits on
an event queue) and keeps the connection's ticks (heartbeats) and its messages flowing; it hands
the socket back as soon as a thread wants to wait on it. Whoever leads is the only thread touching
the socket; others queue what they send for the leader (woken through an eventfd).

This part owns the socket once handed it (and its CURVE monitor socket), the leadership, the queue
of frames others sent, and the tick timer; what a frame, a tick or a monitor event means is the
connection's (callbacks).
"""
from __future__ import annotations

import collections
import logging
import math
import os
import threading
import time
from typing import Any, Callable

import zmq
from zmq.utils.monitor import parse_monitor_message

from specgen.runtime.socket_io import NOBLOCK, POLLIN, recv_frame, send_frames

log = logging.getLogger("specgen.runtime.transport")   # the connection's logger

KEEPER_TAKEOVER_S = 0.02   # a socket no thread drove for this long is taken over by the keeper


class SocketDriver:
    def __init__(
        self,
        sock: zmq.Socket,
        monitor: zmq.Socket | None,
        name: str,
        thread_name: str,
        tick_interval_s: float,
        on_frame: Callable[[bytes], None],
        on_tick: Callable[[float], None],
        on_monitor: Callable[[dict[str, Any]], None],
    ) -> None:
        """`on_frame(frame)`: each message received; `on_tick(now)`: every `tick_interval_s`
        (from the first drive on); `on_monitor(event)`: each event of the monitor socket. All are
        called on the leading thread. `name` is the connection's in the log, `thread_name` the
        keeper thread's."""
        self._sock = sock
        self._monitor = monitor
        self.name = name
        self._tick_interval_s = tick_interval_s
        self._on_frame = on_frame
        self._on_tick = on_tick
        self._on_monitor = on_monitor
        self.closed = False
        # Leadership: `_leader` is the ident of the one thread that may touch the socket (None:
        # free). `_waiting` counts threads waiting to lead, `_out` holds frames others queued.
        self._cv = threading.Condition(threading.Lock())
        self._leader: int | None = None
        self._keeper_leads = False
        self._waiting = 0
        self._released_at = time.monotonic()
        self._out: collections.deque[list[bytes]] = collections.deque()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._signalled = False
        self._next_tick = 0.0
        self._poll_items = [(sock, POLLIN), (self._wake_fd, POLLIN)]
        if monitor is not None:
            self._poll_items.append((monitor, POLLIN))
        self._keeper = threading.Thread(target=self._keep, name=thread_name, daemon=True)

    def start(self) -> None:
        self._keeper.start()

    def shut(self, closing: Callable[[], None]) -> bool:
        """Mark the socket closed (what drives it lets go, what waits on it returns); `closing()`
        runs just before, under the lock, so that whoever sees it closed sees what it did. False
        when another thread shut it first."""
        with self._cv:
            if self.closed:
                return False
            closing()
            self.closed = True
            self._cv.notify_all()
        self.wake()
        return True

    def close(self) -> None:
        """After `shut`: take the socket over from whoever leads, send what was queued, close it."""
        me = threading.get_ident()
        if self._keeper.is_alive() and self._keeper.ident != me:
            self._keeper.join(2.0)
        with self._cv:   # a leading thread sees `closed` and lets go
            self._cv.wait_for(lambda: self._leader in (None, me), 2.0)
            self._flush_out()
            self._leader = me
        if self._monitor is not None:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self._monitor.close(linger=0)
        self._sock.close(linger=200)
        fd, self._wake_fd = self._wake_fd, -1
        os.close(fd)

    # -- sending --------------------------------------------------------------------------
    def wake(self) -> None:
        """Make the thread driving the socket look up (safe from a signal handler)."""
        if not self._signalled and self._wake_fd >= 0:
            self._signalled = True
            try:
                os.eventfd_write(self._wake_fd, 1)
            except OSError:   # closed during shutdown
                pass

    def send(self, frames: list[bytes]) -> None:
        me = threading.get_ident()
        if self._leader == me:    # only this thread sets or clears its own leadership
            self._send_now(frames)
            return
        with self._cv:
            if self.closed:
                return
            if self._leader is not None:
                self._out.append(frames)
                self.wake()
                return
            # Free: send from here, holding the lock (so no thread starts leading meanwhile).
            self._flush_out()
            self._send_now(frames)
            self._released_at = time.monotonic()

    def _send_now(self, frames: list[bytes]) -> None:
        try:
            send_frames(self._sock, frames)
        except zmq.ZMQError as exc:   # EAGAIN: the high-water mark is reached
            log.warning("%s: dropped a message: %s", self.name, exc)

    def _flush_out(self) -> None:
        out = self._out
        while out:
            self._send_now(out.popleft())

    # -- leadership -----------------------------------------------------------------------
    def drive(self, done: Callable[[], bool], timeout: float | None = None) -> None:
        """Drive the socket from this thread until `done()` or `timeout` seconds passed.

        While another thread drives it, wait for that one to deliver (it wakes us after each
        burst) or to let go; the keeper lets go as soon as we wait."""
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        if self._leader == threading.get_ident():   # a callback on the leading thread waits
            self._pump(done, deadline, yield_to_waiters=False)
            return
        while not done() and not self.closed:
            if not self._lead(done, deadline):
                return
            try:
                self._pump(done, deadline, yield_to_waiters=False)
            finally:
                self._resign()
            if time.monotonic() >= deadline:
                return

    def _lead(self, done: Callable[[], bool], deadline: float) -> bool:
        with self._cv:
            self._waiting += 1
            try:
                while self._leader is not None:
                    if done() or self.closed:
                        return False
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    if self._keeper_leads:
                        self.wake()
                    self._cv.wait(None if remaining == math.inf else remaining)
            finally:
                self._waiting -= 1
            if done() or self.closed:
                return False
            self._leader = threading.get_ident()
            return True

    def _resign(self) -> None:
        with self._cv:
            self._flush_out()      # what others queued while we led
            self._leader = None
            self._released_at = time.monotonic()
            if self._waiting:
                self._cv.notify_all()

    def _pump(self, done: Callable[[], bool], deadline: float, yield_to_waiters: bool) -> None:
        """The leading thread's loop: receive and dispatch, send what others queued, tick. The
        keeper (`yield_to_waiters`) returns as soon as another thread waits to lead."""
        sock, wake_fd, monitor = self._sock, self._wake_fd, self._monitor
        while not self.closed:
            if self._out:
                self._flush_out()
            if done() or (yield_to_waiters and self._waiting):
                return
            now = time.monotonic()
            if now >= self._next_tick:
                self._next_tick = now + self._tick_interval_s
                self._on_tick(now)
            if now >= deadline:
                return
            timeout_ms = math.ceil((min(deadline, self._next_tick) - now) * 1000)
            events = dict(zmq.zmq_poll(self._poll_items, max(0, timeout_ms)))
            if wake_fd in events:
                # Consume the wake-up, then clear the flag, then look: a thread that still saw the
                # flag set queued before this; one that sees it clear writes a new wake-up.
                try:
                    os.eventfd_read(wake_fd)
                except BlockingIOError:
                    pass
                self._signalled = False
            if sock in events:
                # Messages are one frame each (wire.py); bounded, so sends interleave with a flood.
                for _ in range(1024):
                    try:
                        frame = recv_frame(sock, NOBLOCK)
                    except zmq.Again:
                        break
                    try:
                        self._on_frame(frame)
                    except Exception:  # noqa: BLE001 - a handler bug must not kill the connection
                        log.exception("%s: handler failed on a message", self.name)
                    if done() or not sock.getsockopt(zmq.EVENTS) & POLLIN:   # cheaper than a failed recv
                        break
                if self._waiting:      # followers: a reply may be theirs
                    with self._cv:
                        self._cv.notify_all()
            if monitor is not None and monitor in events:
                self._read_monitor()

    def _keep(self) -> None:
        """Drive the socket whenever no other thread did for KEEPER_TAKEOVER_S, or a tick is due."""
        me = threading.get_ident()
        while True:
            with self._cv:
                while True:
                    if self.closed:
                        return
                    now = time.monotonic()
                    if self._leader is None and not self._waiting:
                        idle = now - self._released_at
                        if idle >= KEEPER_TAKEOVER_S or now >= self._next_tick:
                            self._leader = me
                            self._keeper_leads = True
                            break
                        self._cv.wait(KEEPER_TAKEOVER_S - idle)
                    else:
                        self._cv.wait(KEEPER_TAKEOVER_S)
            try:
                self._pump(lambda: False, math.inf, yield_to_waiters=True)
            except Exception:  # noqa: BLE001 - keep the connection alive whatever a tick did
                log.exception("%s: keeper failed", self.name)
            finally:
                self._keeper_leads = False
                self._resign()

    def _read_monitor(self) -> None:
        assert self._monitor is not None
        while True:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            try:
                self._on_monitor(event)
            except Exception:  # noqa: BLE001
                log.exception("%s: monitor handler failed", self.name)
