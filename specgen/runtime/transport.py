"""Socket plumbing shared by every actor.

ZeroMQ already does each socket's I/O on its own background threads (C++, no GIL): a NOBLOCK send or
receive only moves a message in or out of an in-memory pipe. So no actor needs a Python I/O thread
to keep its loop off the network; what one costs is a hand-over between threads per message, which
on a small machine is a thread wake-up each way and dominates a round trip (BENCHMARKS.md). Threads
touch a socket only where a loop can be busy for long.

`PeerConnection` is the DEALER side every non-scheduler actor uses: Hello/Welcome handshake with a
timeout, heartbeats, `call_id -> Future` requests, re-registration and re-sending of unanswered
requests when the scheduler restarts, and a clear error when the scheduler refuses our CURVE key.
Its socket is driven by whichever thread waits on it (leader/followers): a thread waiting for a
reply, or a worker waiting for its next task, polls the socket itself and dispatches what arrives,
so a reply reaches the waiting thread with no hand-over. A keeper thread takes the socket over when
no thread has driven it for `KEEPER_TAKEOVER_S` (a worker evaluating, a client whose caller waits
on an event queue) and keeps heartbeats, cancels and events flowing; it hands the socket back as
soon as a thread wants to wait on it. Whoever leads is the only thread touching the socket; others
queue what they send for the leader (woken through an eventfd).

`SocketReader` is a plain reading thread for a socket nobody waits on (a node's worker notices).
"""
from __future__ import annotations

import collections
import concurrent.futures
import itertools
import logging
import math
import os
import secrets
import threading
import time
from typing import Any, Callable

import zmq
from zmq.utils.monitor import parse_monitor_message

from specgen.errors import SpecgenError
from specgen.messages import (
    Ack, DeadNotice, ErrorReply, EvaluateQueued, Heartbeat, HeartbeatAck, Hello, WorkDone, Welcome,
    _Wire,
)
from specgen.runtime import wire
from specgen.runtime.auth import ClientKeys, apply_client_keys, presented_credential
from specgen.runtime.settings import RuntimeSettings

log = logging.getLogger(__name__)


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


class RuntimeFailure(SpecgenError):
    """The runtime could not do what was asked (unreachable, refused, timed out)."""


class SchedulerUnreachable(RuntimeFailure):
    pass


class AuthenticationFailed(RuntimeFailure):
    pass


class CallTimeout(RuntimeFailure):
    pass


class SchedulerFailed(RuntimeFailure):
    """The scheduler reported a fatal error (DeadNotice); calls fail until it is back."""


class RemoteError(RuntimeFailure):
    """The scheduler refused a request; `code` is the ErrorReply's code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class SocketReader:
    """A thread that reads a socket nobody waits on (a node's worker notices) and hands each
    message to a callback; it alone touches the socket, and closes it when stopped."""

    def __init__(self, sock: zmq.Socket, name: str, on_frames: Callable[[list[bytes]], None]) -> None:
        self.sock = sock
        self.name = name
        self._on_frames = on_frames
        self._running = True
        self._thread = threading.Thread(target=self._run, name=f"reader-{name}", daemon=True)

    def start(self) -> "SocketReader":
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._running = False       # seen within one poll interval
        if self._thread.ident is None:
            self.sock.close(linger=0)
        elif self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        sock = self.sock
        try:
            while self._running:
                if not sock.poll(200, zmq.POLLIN):
                    continue
                while True:
                    try:
                        frames = sock.recv_multipart(flags=zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    try:
                        self._on_frames(frames)
                    except Exception:  # noqa: BLE001 - a handler bug must not kill the reader
                        log.exception("%s: handler failed on a message", self.name)
        finally:
            sock.close(linger=0)


def new_context() -> zmq.Context:
    return zmq.Context()


def configure(sock: zmq.Socket, settings: RuntimeSettings) -> None:
    sock.sndhwm = settings.socket_hwm
    sock.rcvhwm = settings.socket_hwm
    # Refuse oversized frames at the transport before they are buffered; a peer that sends one
    # is disconnected (no reply is possible), messages up to the setting get an ErrorReply.
    sock.setsockopt(zmq.MAXMSGSIZE, 2 * settings.max_message_bytes + 65536)


KEEPER_TAKEOVER_S = 0.02   # a socket no thread drove for this long is taken over by the keeper


def _settle(fut: concurrent.futures.Future | None, result: Any = None,
            error: BaseException | None = None) -> None:
    if fut is None or fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


_CONTROL = frozenset((Welcome, HeartbeatAck, DeadNotice, ErrorReply))


class _Waiter:
    """What a blocking request() waits on: the part of a Future the connection uses, without the
    condition variable and callbacks (the waiting thread drives the socket and sees it done).
    Progress notices of the request (EvaluateQueued) go to `progress`."""

    __slots__ = ("value", "error", "finished", "heard", "notice", "on_progress")

    def __init__(self, on_progress: Callable[[Any], None] | None = None) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self.heard = 0.0          # monotonic time of the latest progress notice; 0: none yet
        self.notice: Any = None   # that notice
        self.on_progress = on_progress

    def progress(self, notice: Any) -> None:
        self.heard, self.notice = time.monotonic(), notice
        if self.on_progress is not None:
            self.on_progress(notice)

    def done(self) -> bool:
        return self.finished

    def set_result(self, value: Any) -> None:
        self.value, self.finished = value, True

    def set_exception(self, error: BaseException) -> None:
        self.error, self.finished = error, True


class _Reply(concurrent.futures.Future):
    """A request's Future: waiting on it drives the connection from the waiting thread."""

    def __init__(self, conn: "PeerConnection") -> None:
        super().__init__()
        self._conn = conn

    def result(self, timeout: float | None = None) -> Any:
        self._conn.drive(self.done, timeout)
        return super().result(0 if not self.done() else None)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._conn.drive(self.done, timeout)
        return super().exception(0 if not self.done() else None)


class PeerConnection:
    """A DEALER connection to the scheduler for one actor (client, worker, node, reasoner)."""

    def __init__(
        self,
        address: str,
        role: str,
        name: str,
        settings: RuntimeSettings,
        keys: ClientKeys | None = None,
        on_message: Callable[[_Wire], None] | None = None,
        hello_fields: Callable[[], dict[str, Any]] | None = None,
        heartbeat_fields: Callable[[], dict[str, Any]] | None = None,
        on_reconnect: Callable[[], None] | None = None,
        ctx: zmq.Context | None = None,
        credential: str | None = None,
    ) -> None:
        """`credential`: what its Hello presents (None: what `auth.present_credential` set for
        this role and name)."""
        self.address = address
        self.role = role
        self.name = name
        self.settings = settings
        # Unguessable: without CURVE, a connection that took this routing id over would be taken
        # for this peer (ROUTER_HANDOVER) until it says Hello.
        self.identity = f"{role}/{name}/{secrets.token_hex(8)}".encode()
        self._credential = credential
        self._on_message = on_message
        self._hello_fields = hello_fields or (lambda: {})
        self._heartbeat_fields = heartbeat_fields or (lambda: {})
        self._on_reconnect = on_reconnect
        self._own_ctx = ctx is None
        self.ctx = ctx or new_context()
        self._ids = itertools.count(1)
        # call_id -> (request, its Future; None for a message kept until acked, see send_kept)
        self._pending: dict[int, tuple[_Wire, concurrent.futures.Future | None]] = {}
        self._lock = threading.Lock()
        self.welcome: Welcome | None = None
        self._rejoining = False
        self._welcomed = threading.Event()
        self.scheduler_id: str | None = None
        self.last_heard = 0.0
        self._last_hello = 0.0
        self._last_call_id = 0
        self._resend_upto = 0
        self._acks_due: list[int] = []   # acked call_ids not yet dropped from _pending
        self.auth_error: str | None = None
        self.scheduler_failure: str | None = None
        self.handshake_failures = 0
        self._closed = False
        self.close_error = RuntimeFailure("connection closed")   # what waits fail with, once closed
        sock = self.ctx.socket(zmq.DEALER)
        configure(sock, settings)
        sock.setsockopt(zmq.ROUTING_ID, self.identity)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        if keys is not None:
            apply_client_keys(sock, keys)
        self._keys = keys
        sock.connect(address)
        self._sock = sock
        self._monitor = sock.get_monitor_socket() if keys is not None else None
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
        if self._monitor is not None:
            self._poll_items.append((self._monitor, POLLIN))
        self._keeper = threading.Thread(target=self._keep, name=f"keeper-{role}-{name}", daemon=True)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "PeerConnection":
        self._keeper.start()
        self._send_hello()
        return self

    def wait_welcome(self, timeout: float | None = None) -> Welcome:
        timeout = self.settings.connect_timeout_s if timeout is None else timeout
        self.drive(lambda: self._welcomed.is_set() or self.auth_error is not None, timeout)
        if self.auth_error and not self._welcomed.is_set():
            raise AuthenticationFailed(self.auth_error)
        problem = self.welcome_problem(timeout)
        if problem is not None:
            raise SchedulerUnreachable(problem)
        assert self.welcome is not None
        return self.welcome

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def welcomed(self) -> bool:
        return self._welcomed.is_set()

    def welcome_problem(self, waited_s: float) -> str | None:
        """Why no Welcome came in `waited_s` seconds, in words (None once welcomed): a refused key,
        failed CURVE handshakes (a wrong server key), or silence."""
        if self._welcomed.is_set():
            return None
        if self.auth_error:
            return self.auth_error
        hint = (
            f"; {self.handshake_failures} CURVE handshakes failed: check that the server "
            "public key matches the scheduler's" if self.handshake_failures else ""
        )
        return (f"no answer from the scheduler at {self.address} within {waited_s:g} s "
                f"(setting connect_timeout_s){hint}; is `specgen serve` running there?")

    def close(self, goodbye: _Wire | None = None, error: RuntimeFailure | None = None) -> None:
        """Close the connection; what waits on a reply fails with `error` (default: "connection
        closed"). Safe to call from any thread, more than once."""
        if self._closed:
            return
        if goodbye is not None:
            self.send(goodbye)
        with self._cv:
            if self._closed:    # another thread closes it
                return
            self.close_error = error or RuntimeFailure("connection closed")
            self._closed = True
            self._cv.notify_all()
        self.wake()
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
        for _, fut in pending:
            _settle(fut, error=self.close_error)
        me = threading.get_ident()
        if self._keeper.is_alive() and self._keeper.ident != me:
            self._keeper.join(2.0)
        with self._cv:   # a leading thread sees _closed and lets go
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
        if self._own_ctx:
            self.ctx.term()

    # -- sending --------------------------------------------------------------------------
    def send(self, msg: _Wire) -> None:
        self._send_frames(wire.encode(msg))

    def wake(self) -> None:
        """Make the thread driving the socket look up (safe from a signal handler)."""
        if not self._signalled and self._wake_fd >= 0:
            self._signalled = True
            try:
                os.eventfd_write(self._wake_fd, 1)
            except OSError:   # closed during shutdown
                pass

    def next_call_id(self) -> int:
        return next(self._ids)

    def call(self, msg: _Wire, fut: Any = None) -> concurrent.futures.Future:
        """Send a request (its call_id is set here); the Future gets the reply or an error."""
        fut = _Reply(self) if fut is None else fut
        if self.scheduler_failure is not None and not isinstance(msg, WorkDone):
            fut.set_exception(SchedulerFailed(self.scheduler_failure))
            return fut
        call_id = next(self._ids)
        self._last_call_id = call_id
        msg.call_id = call_id  # type: ignore[attr-defined]
        frames = wire.encode(msg)
        limit = self.settings.max_message_bytes
        size = len(frames[0])   # one frame (wire.py)
        if size > limit:
            fut.set_exception(RemoteError(
                "too_large", f"message of {size} bytes exceeds the limit of {limit} bytes "
                "(setting max_message_bytes)"))
            return fut
        with self._lock:
            self._pending[call_id] = (msg, fut)
        self._send_frames(frames)
        return fut

    def send_kept(self, msg: _Wire) -> None:
        """Send a message with a call_id that needs no reply but must survive a scheduler restart
        (a worker's result): kept, and re-sent after re-registration, until acknowledged."""
        call_id = next(self._ids)
        self._last_call_id = call_id
        msg.call_id = call_id  # type: ignore[attr-defined]
        with self._lock:
            self._pending[call_id] = (msg, None)
        self._send_frames(wire.encode(msg))

    def kept(self) -> list[_Wire]:
        """The messages sent with send_kept that are not acknowledged yet, oldest first."""
        with self._lock:
            return [msg for msg, fut in self._pending.values() if fut is None]

    def request(self, msg: _Wire, timeout: float | None = None,
                on_progress: Callable[[Any], None] | None = None) -> _Wire:
        """Send `msg` and wait for its reply. `timeout` (default: the setting call_timeout_s)
        bounds the scheduler's silence about the request, not the request: each progress notice
        of it (EvaluateQueued, for an EvaluateRequest that asked for them) restarts the wait, and
        goes to `on_progress` on the thread that drives the connection then."""
        timeout = self.settings.call_timeout_s if timeout is None else timeout
        waiter = _Waiter(on_progress)
        self.call(msg, waiter)
        if not waiter.finished:
            self.drive(waiter.done, timeout)
            while not waiter.finished and waiter.heard and not self._closed:
                remaining = waiter.heard + timeout - time.monotonic()
                if remaining <= 0:
                    break
                self.drive(waiter.done, remaining)
        if waiter.error is not None:
            raise waiter.error
        if not waiter.finished:
            with self._lock:
                self._pending.pop(msg.call_id, None)  # type: ignore[attr-defined]
            if self._closed:   # closed while it waited (or before): not a timeout
                raise self.close_error
            notice = waiter.notice
            if notice is None:
                raise CallTimeout(
                    f"{type(msg).__name__} got no reply from {self.address} within {timeout:g} s "
                    "(setting call_timeout_s)"
                )
            where = "running" if notice.running else f"queued at position {notice.position}"
            raise CallTimeout(
                f"{type(msg).__name__}: the scheduler at {self.address} said nothing of it for "
                f"{timeout:g} s (setting call_timeout_s); it last reported it {where}"
            )
        return waiter.value

    def _send_frames(self, frames: list[bytes]) -> None:
        me = threading.get_ident()
        if self._leader == me:    # only this thread sets or clears its own leadership
            self._send_now(frames)
            return
        with self._cv:
            if self._closed:
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
        while not done() and not self._closed:
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
                    if done() or self._closed:
                        return False
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    if self._keeper_leads:
                        self.wake()
                    self._cv.wait(None if remaining == math.inf else remaining)
            finally:
                self._waiting -= 1
            if done() or self._closed:
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
        while not self._closed:
            if self._out:
                self._flush_out()
            if done() or (yield_to_waiters and self._waiting):
                return
            now = time.monotonic()
            if now >= self._next_tick:
                self._tick(now)
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
                    if self._closed:
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

    # -- the leading thread -----------------------------------------------------------------
    def _send_hello(self, again: bool = False) -> None:
        """`again`: we were registered before; requests sent until now may have been refused
        (or their replies lost with a dead scheduler), so re-send them once Welcome arrives."""
        if again:
            self._resend_upto = self._last_call_id
            # Whether the scheduler restarted or only timed us out, what it sent meanwhile
            # (candidate updates, job events) did not reach us: pick the streams up again.
            self._rejoining = True
        self._last_hello = time.monotonic()
        credential = self._credential if self._credential is not None else presented_credential(self.role, self.name)
        self.send(Hello(role=self.role, name=self.name, pid=os.getpid(), credential=credential,
                        **self._hello_fields()))

    def _tick(self, now: float) -> None:
        self._next_tick = now + self.settings.heartbeat_interval_s
        if self._acks_due:
            self._apply_acks()
        if not self._welcomed.is_set():
            if now - self._last_hello >= 1.0:
                self._send_hello()
            return
        self.send(Heartbeat(sent_at=time.time(), **self._heartbeat_fields()))

    def _on_monitor(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self.auth_error = (
                f"the scheduler at {self.address} refused this peer's CURVE key (ZAP status "
                f"{event['value']}): copy its public key into the scheduler's keys/authorized/ "
                "directory and restart the scheduler"
            )
        elif kind in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
            self.handshake_failures += 1

    def _resend_pending(self) -> None:
        self._apply_acks()
        upto, self._resend_upto = self._resend_upto, 0
        with self._lock:
            items = [(cid, entry) for cid, entry in self._pending.items() if cid <= upto]
        for _, (msg, fut) in sorted(items, key=lambda item: item[0]):
            if fut is None or not fut.done():
                self._send_frames(wire.encode(msg))

    def _apply_acks(self) -> None:
        call_ids, self._acks_due = self._acks_due, []
        with self._lock:
            entries = [self._pending.pop(cid, None) for cid in call_ids]
        for entry in entries:
            if entry is not None and entry[1] is not None:
                _settle(entry[1], Ack(call_id=entry[0].call_id))  # type: ignore[attr-defined]

    def _on_frame(self, frame: bytes) -> None:
        try:
            msg = wire.decode_frame(frame, 2 * self.settings.max_message_bytes)
        except wire.WireError as exc:
            log.warning("%s: refused a message from the scheduler: %s", self.name, exc.message)
            return
        self.last_heard = time.monotonic()
        acked = getattr(msg, "acked", None)
        if acked:   # results the scheduler committed (AssignWork, HeartbeatAck carry them),
            self._acks_due += acked   # forgotten at the next tick, off the way of the new work
        if type(msg) in _CONTROL:
            self._on_control(msg)
            return
        if type(msg) is EvaluateQueued:   # a request's progress: it stays pending
            with self._lock:
                entry = self._pending.get(msg.call_id)
            progress = getattr(entry[1], "progress", None) if entry is not None else None
            if progress is not None:
                progress(msg)
            return
        call_id = getattr(msg, "call_id", 0)
        if call_id:
            with self._lock:
                entry = self._pending.pop(call_id, None)
            if entry is not None:
                _settle(entry[1], msg)
                return
            if isinstance(msg, Ack):
                return   # a late duplicate answer to a request re-sent after a restart
        if self._on_message is not None:
            self._on_message(msg)

    def _on_control(self, msg: _Wire) -> None:
        """Welcome, HeartbeatAck, DeadNotice, ErrorReply: the connection's own messages."""
        if isinstance(msg, Welcome):
            changed = self.scheduler_id is not None and msg.scheduler_id != self.scheduler_id
            self.scheduler_id = msg.scheduler_id
            self.welcome = msg
            self.auth_error = None
            if changed:
                self.scheduler_failure = None
            self._welcomed.set()
            self._resend_pending()
            rejoined, self._rejoining = self._rejoining, False
            if (changed or rejoined) and self._on_reconnect is not None:
                self._on_reconnect()
            return
        if isinstance(msg, HeartbeatAck):
            if msg.scheduler_id != self.scheduler_id:
                self._send_hello(again=True)   # the scheduler restarted: register again
            return
        if isinstance(msg, DeadNotice):
            # Fail what waits now instead of at its timeout; results a worker holds are kept and
            # re-sent to the scheduler that comes back.
            self.scheduler_failure = (f"the scheduler at {self.address} failed: {msg.reason}; "
                                      "requests fail until it is restarted")
            log.error("%s: %s", self.name, self.scheduler_failure)
            with self._lock:
                doomed = [(cid, e) for cid, e in self._pending.items() if not isinstance(e[0], WorkDone)]
                for cid, _ in doomed:
                    del self._pending[cid]
            for _, (_, fut) in doomed:
                _settle(fut, error=SchedulerFailed(self.scheduler_failure))
            return
        if isinstance(msg, ErrorReply):
            if msg.code == "unregistered":
                # The scheduler does not know us (it restarted, or timed us out): say Hello;
                # unanswered requests are re-sent once it answers.
                if time.monotonic() - self._last_hello > 0.2 or not self._resend_upto:
                    self._send_hello(again=True)
                return
            with self._lock:
                entry = self._pending.pop(msg.ref, None) if msg.ref else None
            if entry is not None:
                _settle(entry[1], error=RemoteError(msg.code, msg.message))
            else:
                log.warning("%s: scheduler error: %s: %s", self.name, msg.code, msg.message)
            return
