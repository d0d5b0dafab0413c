"""Socket plumbing shared by every actor.

ZeroMQ already does each socket's I/O on its own background threads (C++, no GIL): a NOBLOCK send or
receive only moves a message in or out of an in-memory pipe. So no actor needs a Python I/O thread
to keep its loop off the network; what one costs is a hand-over between threads per message, which
on a small machine is a thread wake-up each way and dominates a round trip (BENCHMARKS.md). Threads
touch a socket only where a loop can be busy for long.

`PeerConnection` is the DEALER side every non-scheduler actor uses: Hello/Welcome handshake with a
timeout, heartbeats, `call_id -> Future` requests, re-registration and re-sending of unanswered
requests when the scheduler restarts, and a clear error when the scheduler refuses our CURVE key.
It composes two parts: its socket is driven by whichever thread waits on it, or by a keeper thread
when none does (socket_driver.py: leader/followers), and its requests and kept messages wait for
their replies and acknowledgements in pending_calls.py. The connection itself says what each
message from the scheduler means.

`SocketReader` is a plain reading thread for a socket nobody waits on (a node's worker notices).
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import secrets
import threading
import time
from typing import Any, Callable

import zmq

from specgen.errors import SpecgenError
from specgen.messages import (
    Ack, DeadNotice, ErrorReply, EvaluateQueued, Heartbeat, HeartbeatAck, Hello, WorkDone, Welcome,
    _Wire,
)
from specgen.runtime import wire
from specgen.runtime.auth import ClientKeys, apply_client_keys, presented_credential
from specgen.runtime.pending_calls import PendingCalls, Reply, Waiter, settle
from specgen.runtime.settings import RuntimeSettings
from specgen.runtime.socket_driver import SocketDriver

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


_CONTROL = frozenset((Welcome, HeartbeatAck, DeadNotice, ErrorReply))


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
        self.calls = PendingCalls()
        self.welcome: Welcome | None = None
        self._rejoining = False
        self._welcomed = threading.Event()
        self.scheduler_id: str | None = None
        self.last_heard = 0.0
        self._last_hello = 0.0
        self.auth_error: str | None = None
        self.scheduler_failure: str | None = None
        self.handshake_failures = 0
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
        self.driver = SocketDriver(
            sock, sock.get_monitor_socket() if keys is not None else None, name, f"keeper-{role}-{name}",
            settings.heartbeat_interval_s, on_frame=self._on_frame, on_tick=self._tick,
            on_monitor=self._on_monitor)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "PeerConnection":
        self.driver.start()
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
        return self.driver.closed

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
        if self.driver.closed:
            return
        if goodbye is not None:
            self.send(goodbye)

        def closing() -> None:
            self.close_error = error or RuntimeFailure("connection closed")

        if not self.driver.shut(closing):   # another thread closes it
            return
        for fut in self.calls.take(lambda msg: True):
            settle(fut, error=self.close_error)
        self.driver.close()
        if self._own_ctx:
            self.ctx.term()

    # -- sending --------------------------------------------------------------------------
    def send(self, msg: _Wire) -> None:
        self.driver.send(wire.encode(msg))

    def wake(self) -> None:
        """Make the thread driving the socket look up (safe from a signal handler)."""
        self.driver.wake()

    def next_call_id(self) -> int:
        return self.calls.next_call_id()

    def call(self, msg: _Wire, fut: Any = None) -> concurrent.futures.Future:
        """Send a request (its call_id is set here); the Future gets the reply or an error."""
        fut = Reply(self.drive) if fut is None else fut
        if self.scheduler_failure is not None and not isinstance(msg, WorkDone):
            fut.set_exception(SchedulerFailed(self.scheduler_failure))
            return fut
        call_id = self.calls.number(msg)
        frames = wire.encode(msg)
        limit = self.settings.max_message_bytes
        size = len(frames[0])   # one frame (wire.py)
        if size > limit:
            fut.set_exception(RemoteError(
                "too_large", f"message of {size} bytes exceeds the limit of {limit} bytes "
                "(setting max_message_bytes)"))
            return fut
        self.calls.add(call_id, msg, fut)
        self.driver.send(frames)
        return fut

    def send_kept(self, msg: _Wire) -> None:
        """Send a message with a call_id that needs no reply but must survive a scheduler restart
        (a worker's result): kept, and re-sent after re-registration, until acknowledged."""
        call_id = self.calls.number(msg)
        self.calls.add(call_id, msg, None)
        self.driver.send(wire.encode(msg))

    def kept(self) -> list[_Wire]:
        """The messages sent with send_kept that are not acknowledged yet, oldest first."""
        return self.calls.kept()

    def request(self, msg: _Wire, timeout: float | None = None,
                on_progress: Callable[[Any], None] | None = None) -> _Wire:
        """Send `msg` and wait for its reply. `timeout` (default: the setting call_timeout_s)
        bounds the scheduler's silence about the request, not the request: each progress notice
        of it (EvaluateQueued, for an EvaluateRequest that asked for them) restarts the wait, and
        goes to `on_progress` on the thread that drives the connection then."""
        timeout = self.settings.call_timeout_s if timeout is None else timeout
        waiter = Waiter(on_progress)
        self.call(msg, waiter)
        if not waiter.finished:
            self.drive(waiter.done, timeout)
            while not waiter.finished and waiter.heard and not self.driver.closed:
                remaining = waiter.heard + timeout - time.monotonic()
                if remaining <= 0:
                    break
                self.drive(waiter.done, remaining)
        if waiter.error is not None:
            raise waiter.error
        if not waiter.finished:
            self.calls.pop(msg.call_id)  # type: ignore[attr-defined]
            if self.driver.closed:   # closed while it waited (or before): not a timeout
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

    def drive(self, done: Callable[[], bool], timeout: float | None = None) -> None:
        """Drive the socket from this thread until `done()` or `timeout` seconds passed (or
        wait for the thread that drives it to deliver)."""
        self.driver.drive(done, timeout)

    # -- the leading thread -----------------------------------------------------------------
    def _send_hello(self, again: bool = False) -> None:
        """`again`: we were registered before; requests sent until now may have been refused
        (or their replies lost with a dead scheduler), so re-send them once Welcome arrives."""
        if again:
            self.calls.mark_resend()
            # Whether the scheduler restarted or only timed us out, what it sent meanwhile
            # (candidate updates, job events) did not reach us: pick the streams up again.
            self._rejoining = True
        self._last_hello = time.monotonic()
        credential = self._credential if self._credential is not None else presented_credential(self.role, self.name)
        self.send(Hello(role=self.role, name=self.name, pid=os.getpid(), credential=credential,
                        **self._hello_fields()))

    def _tick(self, now: float) -> None:
        if self.calls.acks_due:
            self.calls.apply_acks()
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
        for msg, fut in self.calls.to_resend():
            if fut is None or not fut.done():
                self.send(msg)

    def _on_frame(self, frame: bytes) -> None:
        try:
            msg = wire.decode_frame(frame, 2 * self.settings.max_message_bytes)
        except wire.WireError as exc:
            log.warning("%s: refused a message from the scheduler: %s", self.name, exc.message)
            return
        self.last_heard = time.monotonic()
        acked = getattr(msg, "acked", None)
        if acked:   # results the scheduler committed (AssignWork, HeartbeatAck carry them),
            self.calls.note_acks(acked)   # forgotten at the next tick, off the way of the new work
        if type(msg) in _CONTROL:
            self._on_control(msg)
            return
        if type(msg) is EvaluateQueued:   # a request's progress: it stays pending
            entry = self.calls.get(msg.call_id)
            progress = getattr(entry[1], "progress", None) if entry is not None else None
            if progress is not None:
                progress(msg)
            return
        call_id = getattr(msg, "call_id", 0)
        if call_id:
            entry = self.calls.pop(call_id)
            if entry is not None:
                settle(entry[1], msg)
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
            for fut in self.calls.take(lambda request: not isinstance(request, WorkDone)):
                settle(fut, error=SchedulerFailed(self.scheduler_failure))
            return
        if isinstance(msg, ErrorReply):
            if msg.code == "unregistered":
                # The scheduler does not know us (it restarted, or timed us out): say Hello;
                # unanswered requests are re-sent once it answers.
                if time.monotonic() - self._last_hello > 0.2 or not self.calls.resend_upto:
                    self._send_hello(again=True)
                return
            entry = self.calls.pop(msg.ref) if msg.ref else None
            if entry is not None:
                settle(entry[1], error=RemoteError(msg.code, msg.message))
            else:
                log.warning("%s: scheduler error: %s: %s", self.name, msg.code, msg.message)
            return
