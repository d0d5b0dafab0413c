"""Socket plumbing shared by every actor.

`SocketPump` is the I/O thread: it alone touches its socket, hands received frames to a callback
and sends what any thread queued with `send` (woken through an eventfd), so an actor's busy loop
never blocks on a socket and a socket is never used from two threads.

`PeerConnection` is the DEALER side every non-scheduler actor uses: Hello/Welcome handshake with a
timeout, heartbeats from the I/O thread (so they flow while the actor computes), `call_id ->
Future` requests, re-registration and re-sending of unanswered requests when the scheduler
restarts, and a clear error when the scheduler refuses our CURVE key.
"""
from __future__ import annotations

import collections
import concurrent.futures
import itertools
import logging
import os
import threading
import time
import uuid
from typing import Any, Callable

import zmq
from zmq.utils.monitor import parse_monitor_message

from specgen.errors import SpecgenError
from specgen.messages import (
    Ack, DeadNotice, ErrorReply, Heartbeat, HeartbeatAck, Hello, WorkDone, Welcome, _Wire,
)
from specgen.runtime import wire
from specgen.runtime.auth import ClientKeys, apply_client_keys
from specgen.runtime.settings import RuntimeSettings

log = logging.getLogger(__name__)


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


class SocketPump:
    """The I/O thread of one socket (see module docstring)."""

    def __init__(
        self,
        sock: zmq.Socket,
        name: str,
        on_frames: Callable[[list[bytes]], None],
        on_tick: Callable[[], None] | None = None,
        tick_interval_s: float = 1.0,
        on_monitor: Callable[[dict[str, Any]], None] | None = None,
        on_send_error: Callable[[list[bytes], zmq.ZMQError], None] | None = None,
        linger_ms: int = 200,
        on_burst_end: Callable[[], None] | None = None,
    ) -> None:
        self.sock = sock
        self.name = name
        self._on_frames = on_frames
        self._on_tick = on_tick
        self._tick_interval = tick_interval_s
        self._on_send_error = on_send_error
        self._on_burst_end = on_burst_end   # called after each burst of received messages
        self._on_monitor = on_monitor
        self._monitor = sock.get_monitor_socket() if on_monitor else None
        self._out: collections.deque[list[bytes]] = collections.deque()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._signalled = False
        self._running = True
        self._linger_ms = linger_ms
        self.sent = 0
        self.received = 0
        self._thread = threading.Thread(target=self._run, name=f"io-{name}", daemon=True)

    def start(self) -> "SocketPump":
        self._thread.start()
        return self

    def send(self, frames: list[bytes]) -> None:
        """Queue frames for sending; safe from any thread. Dropped once the pump stopped."""
        if not self._running:
            return
        self._out.append(frames)
        if not self._signalled:
            self._signalled = True
            try:
                os.eventfd_write(self._wake_fd, 1)
            except OSError:   # closed during shutdown
                pass

    def stop(self, timeout: float = 2.0) -> None:
        if self._thread.ident is None:   # never started: nothing else owns the socket
            if self._running:
                self._running = False
                if self._monitor is not None:
                    self._monitor.close(linger=0)
                self.sock.close(linger=0)
                os.close(self._wake_fd)
            return
        self._running = False
        try:
            os.eventfd_write(self._wake_fd, 1)
        except OSError:
            pass
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _flush(self) -> None:
        # Consume the wake-up first, then clear the flag, then drain: a sender that still saw the
        # flag set appended before the drain below; one that sees it clear writes a new wake-up.
        try:
            os.eventfd_read(self._wake_fd)
        except BlockingIOError:
            pass
        self._signalled = False
        out = self._out
        sock = self.sock
        while out:
            frames = out.popleft()
            try:
                sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                self.sent += 1
            except zmq.ZMQError as exc:
                # ROUTER_MANDATORY: unknown peer (EHOSTUNREACH) or its queue is full (EAGAIN).
                if self._on_send_error is not None:
                    self._on_send_error(frames, exc)
                else:
                    log.warning("%s: dropped a message: %s", self.name, exc)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._wake_fd, zmq.POLLIN)
        if self._monitor is not None:
            poller.register(self._monitor, zmq.POLLIN)
        next_tick = time.monotonic() + self._tick_interval
        sock = self.sock
        try:
            while self._running:
                timeout_ms = max(0, int((next_tick - time.monotonic()) * 1000)) if self._on_tick else 1000
                events = dict(poller.poll(timeout_ms))
                if sock in events:
                    for _ in range(1024):   # bounded, so sends interleave with a flood of input
                        try:
                            frames = sock.recv_multipart(flags=zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self.received += 1
                        try:
                            self._on_frames(frames)
                        except Exception:  # noqa: BLE001 - a handler bug must not kill the I/O thread
                            log.exception("%s: handler failed on a message", self.name)
                    if self._on_burst_end is not None:
                        self._on_burst_end()
                if self._out or self._wake_fd in events:
                    self._flush()
                if self._monitor is not None and self._monitor in events:
                    while True:
                        try:
                            event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))
                        except zmq.Again:
                            break
                        try:
                            self._on_monitor(event)  # type: ignore[misc]
                        except Exception:  # noqa: BLE001
                            log.exception("%s: monitor handler failed", self.name)
                if self._on_tick is not None and time.monotonic() >= next_tick:
                    next_tick = time.monotonic() + self._tick_interval
                    try:
                        self._on_tick()
                    except Exception:  # noqa: BLE001
                        log.exception("%s: tick failed", self.name)
            self._flush()
        finally:
            if self._monitor is not None:
                try:
                    sock.disable_monitor()
                except zmq.ZMQError:
                    pass
                self._monitor.close(linger=0)
            sock.close(linger=self._linger_ms)
            os.close(self._wake_fd)


def new_context() -> zmq.Context:
    return zmq.Context()


def configure(sock: zmq.Socket, settings: RuntimeSettings) -> None:
    sock.sndhwm = settings.socket_hwm
    sock.rcvhwm = settings.socket_hwm
    # Refuse oversized frames at the transport before they are buffered; a peer that sends one
    # is disconnected (no reply is possible), messages up to the setting get an ErrorReply.
    sock.setsockopt(zmq.MAXMSGSIZE, 2 * settings.max_message_bytes + 65536)


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
    ) -> None:
        self.address = address
        self.role = role
        self.name = name
        self.settings = settings
        self.identity = f"{role}/{name}/{uuid.uuid4().hex[:8]}".encode()
        self._on_message = on_message
        self._hello_fields = hello_fields or (lambda: {})
        self._heartbeat_fields = heartbeat_fields or (lambda: {})
        self._on_reconnect = on_reconnect
        self._own_ctx = ctx is None
        self.ctx = ctx or new_context()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[_Wire, concurrent.futures.Future]] = {}
        self._lock = threading.Lock()
        self.welcome: Welcome | None = None
        self._rejoining = False
        self._welcomed = threading.Event()
        self.scheduler_id: str | None = None
        self.last_heard = 0.0
        self._last_hello = 0.0
        self._last_call_id = 0
        self._resend_upto = 0
        self.auth_error: str | None = None
        self.scheduler_failure: str | None = None
        self.handshake_failures = 0
        self._closed = False
        sock = self.ctx.socket(zmq.DEALER)
        configure(sock, settings)
        sock.setsockopt(zmq.ROUTING_ID, self.identity)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        if keys is not None:
            apply_client_keys(sock, keys)
        self._keys = keys
        sock.connect(address)
        self.pump = SocketPump(
            sock, f"{role}-{name}", self._on_frames, on_tick=self._tick,
            tick_interval_s=settings.heartbeat_interval_s,
            on_monitor=self._on_monitor if keys is not None else None,
        )

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "PeerConnection":
        self.pump.start()
        self._send_hello()
        return self

    def wait_welcome(self, timeout: float | None = None) -> Welcome:
        timeout = self.settings.connect_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not self._welcomed.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
            if self.auth_error:
                raise AuthenticationFailed(self.auth_error)
            if time.monotonic() >= deadline:
                hint = (
                    f"; {self.handshake_failures} CURVE handshakes failed: check that the server "
                    "public key matches the scheduler's" if self.handshake_failures else ""
                )
                raise SchedulerUnreachable(
                    f"no answer from the scheduler at {self.address} within {timeout:g} s "
                    f"(setting connect_timeout_s){hint}; is `specgen serve` running there?"
                )
        assert self.welcome is not None
        return self.welcome

    def close(self, goodbye: _Wire | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        if goodbye is not None:
            self.send(goodbye)
        self.pump.stop()
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
        for _, fut in pending:
            if not fut.done():
                fut.set_exception(RuntimeFailure("connection closed"))
        if self._own_ctx:
            self.ctx.term()

    # -- sending --------------------------------------------------------------------------
    def send(self, msg: _Wire) -> None:
        self.pump.send(wire.encode(msg))

    def next_call_id(self) -> int:
        return next(self._ids)

    def call(self, msg: _Wire) -> concurrent.futures.Future:
        """Send a request (its call_id is set here); the Future gets the reply or an error."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if self.scheduler_failure is not None and not isinstance(msg, WorkDone):
            fut.set_exception(SchedulerFailed(self.scheduler_failure))
            return fut
        call_id = next(self._ids)
        self._last_call_id = call_id
        msg.call_id = call_id  # type: ignore[attr-defined]
        frames = wire.encode(msg)
        limit = self.settings.max_message_bytes
        size = sum(len(f) for f in frames)
        if size > limit:
            fut.set_exception(RemoteError(
                "too_large", f"message of {size} bytes exceeds the limit of {limit} bytes "
                "(setting max_message_bytes)"))
            return fut
        with self._lock:
            self._pending[call_id] = (msg, fut)
        self.pump.send(frames)
        return fut

    def request(self, msg: _Wire, timeout: float | None = None) -> _Wire:
        timeout = self.settings.call_timeout_s if timeout is None else timeout
        fut = self.call(msg)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            with self._lock:
                self._pending.pop(msg.call_id, None)  # type: ignore[attr-defined]
            raise CallTimeout(
                f"{type(msg).__name__} got no reply from {self.address} within {timeout:g} s "
                "(setting call_timeout_s)"
            ) from None

    # -- I/O thread -----------------------------------------------------------------------
    def _send_hello(self, again: bool = False) -> None:
        """`again`: we were registered before; requests sent until now may have been refused
        (or their replies lost with a dead scheduler), so re-send them once Welcome arrives."""
        if again:
            self._resend_upto = self._last_call_id
            # Whether the scheduler restarted or only timed us out, what it sent meanwhile
            # (candidate updates, job events) did not reach us: pick the streams up again.
            self._rejoining = True
        self._last_hello = time.monotonic()
        self.send(Hello(role=self.role, name=self.name, pid=os.getpid(), **self._hello_fields()))

    def _tick(self) -> None:
        now = time.monotonic()
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
        upto, self._resend_upto = self._resend_upto, 0
        with self._lock:
            items = [(cid, entry) for cid, entry in self._pending.items() if cid <= upto]
        for _, (msg, fut) in sorted(items, key=lambda item: item[0]):
            if not fut.done():
                self.pump.send(wire.encode(msg))

    def _on_frames(self, frames: list[bytes]) -> None:
        try:
            msg = wire.decode(frames, 2 * self.settings.max_message_bytes)
        except wire.WireError as exc:
            log.warning("%s: refused a message from the scheduler: %s", self.name, exc.message)
            return
        self.last_heard = time.monotonic()
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
                if not fut.done():
                    fut.set_exception(SchedulerFailed(self.scheduler_failure))
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
                entry[1].set_exception(RemoteError(msg.code, msg.message))
            else:
                log.warning("%s: scheduler error: %s: %s", self.name, msg.code, msg.message)
            return
        call_id = getattr(msg, "call_id", 0)
        if call_id:
            with self._lock:
                entry = self._pending.pop(call_id, None)
            if entry is not None:
                entry[1].set_result(msg)
                return
            if isinstance(msg, Ack):
                return   # a late duplicate answer to a request re-sent after a restart
        if self._on_message is not None:
            self._on_message(msg)
