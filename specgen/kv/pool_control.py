"""The control channel of a KV pool that lives inside an engine process (ZeroMQ, msgpack).

A pool hosted by vLLM's offloading connector runs in the engine's scheduler process, out of reach of
specgen's own objects. It connects a DEALER socket to an endpoint the node (or scheduler, or a test)
binds with a ROUTER (`KvPoolController`): the pool sends its `KvPoolStats` every `stats_interval_s` and
after each resize, and takes `KvPoolResize` requests. Each is one frame framed by specgen.wire like
every runtime message (a ROUTER sees the pool's identity first); the channel has no error reply,
so a frame that is not the one message type a side takes is skipped. The pool side never blocks: it
polls from the engine's scheduling loop.

A `RemoteKvPool` held by any other process (e.g. a profiler worker that owns the spare memory) joins
the same channel through `PoolControlAgent`, stepped from the thread that uses the pool. The runtime's
scheduler binds the controller side when its setting `kv_control_bind` is set (see
specgen/runtime/kv_steward.py): it shrinks a pool while workers on the pool's GPU evaluate candidates
and grows it back when they are idle.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, TypeVar

import zmq

from specgen import wire
from specgen.kv.pool_errors import KvPoolError, KvPoolTimeout
from specgen.messages import KvPoolResize, KvPoolStats

if TYPE_CHECKING:
    from specgen.kv.pool import RemoteKvPool

log = logging.getLogger(__name__)

M = TypeVar("M", KvPoolStats, KvPoolResize)
MAX_MESSAGE_BYTES = 1 << 20     # a pool's stats are under a kilobyte; anything far larger is not one


def read_frame(frame: bytes, cls: type[M]) -> M | None:
    """The `cls` message in `frame`, else None (the channel has no error reply to send)."""
    try:
        msg = wire.decode_frame(frame, MAX_MESSAGE_BYTES)
    except wire.WireError:
        return None
    return msg if type(msg) is cls else None


class PoolControlClient:
    """Pool side: connect, send stats, poll for resize requests (never blocks)."""

    def __init__(self, endpoint: str, identity: str) -> None:
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.IDENTITY, identity.encode())
        self._socket.setsockopt(zmq.LINGER, 0)
        # Stats are replaceable: if the controller is gone, drop them rather than queue without bound.
        self._socket.setsockopt(zmq.SNDHWM, 16)
        self._socket.connect(endpoint)

    @property
    def socket(self) -> zmq.Socket:
        """The DEALER socket (to poll it beside other descriptors)."""
        return self._socket

    def send_stats(self, stats: KvPoolStats) -> None:
        try:
            self._socket.send(wire.encode(stats)[0], flags=zmq.NOBLOCK)
        except zmq.Again:
            pass

    def wait(self, timeout_s: float) -> bool:
        """Block until a frame arrives (the interpreter released meanwhile) or timeout_s; whether one did."""
        return bool(self._socket.poll(int(timeout_s * 1000)))

    def poll_resize(self) -> list[KvPoolResize]:
        """Resize requests received since the last call; malformed frames are skipped."""
        out = []
        while True:
            try:
                frames = self._socket.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return out
            if len(frames) == 1 and (request := read_frame(frames[0], KvPoolResize)) is not None:
                out.append(request)

    def close(self) -> None:
        self._socket.close(linger=0)


class PoolControlAgent:
    """Serves a `RemoteKvPool` on the control channel: applies resize requests, reports stats.

    `step()` must run in the thread that uses the pool (a RemoteKvPool is not thread-safe): it
    applies the resize requests that arrived (a shrink waits for copies in flight on the segments it
    gives back, at most `shrink_timeout_s`) and sends stats after a resize or every
    `stats_interval_s`.
    """

    def __init__(self, pool: "RemoteKvPool", endpoint: str, identity: str | None = None, *,
                 stats_interval_s: float = 1.0, shrink_timeout_s: float = 30.0) -> None:
        self.pool = pool
        self.identity = identity or pool.pool_id
        if not self.identity:
            raise KvPoolError("PoolControlAgent needs an identity (or a pool with a pool_id)")
        self.stats_interval_s = stats_interval_s
        self.shrink_timeout_s = shrink_timeout_s
        self.client = PoolControlClient(endpoint, self.identity)
        self._last_stats = -float("inf")
        self.applied: list[tuple[KvPoolResize, int]] = []   # (request, capacity after it)

    def apply(self, request: KvPoolResize) -> int:
        """Resize the pool toward request.target_bytes in whole segments; the capacity after it.

        A shrink gives back at least what is asked (never keeps more than the target); a grow takes
        at most what is asked, as far as headroom and max_bytes allow."""
        pool = self.pool
        target = request.target_bytes
        if target is not None:
            capacity = pool.capacity_bytes
            if target < capacity:
                try:
                    pool.shrink(capacity - max(0, target), timeout_s=self.shrink_timeout_s)
                except KvPoolTimeout as exc:
                    # Part of it may be done; the stats sent next say what the pool holds now.
                    log.warning("KV pool %s: shrink to %d bytes incomplete (PoolControlAgent shrink_timeout_s=%g): "
                                "%s", self.identity, target, self.shrink_timeout_s, exc)
            elif target > capacity:
                pool.grow(target - capacity)
        return pool.capacity_bytes

    def step(self, now: float | None = None, *, timeout_s: float = 0.0) -> list[KvPoolResize]:
        """Apply the resize requests received since the last step, then report if due; the requests.

        With timeout_s > 0, first wait that long for a request (in the socket, not in a sleep: a
        thread that naps and polls needs the interpreter back after every nap, behind the pool's
        loading thread)."""
        if timeout_s > 0:
            self.client.wait(timeout_s)
        requests = self.client.poll_resize()
        now = time.monotonic() if now is None else now
        due = now - self._last_stats >= self.stats_interval_s
        if not requests and not due:
            return requests
        for request in requests:
            self.applied.append((request, self.apply(request)))
        self._last_stats = now
        self.client.send_stats(self.pool.stats())
        return requests

    def close(self) -> None:
        self.client.close()


class KvPoolController:
    """Controller side: bind, receive pools' stats, ask a pool to resize.

    A pool's agent that has just started may not be connected yet: its DEALER's handshake completes
    in ZeroMQ's I/O threads some time after the agent itself is up (`PoolAgentProcess.wait_started`
    returns once the agent served its pool, not once this side knows it). Until then this ROUTER has
    no route to the pool's identity, so a request waits, at most `connect_timeout_s`, for the agent
    to connect, then fails naming the pool and saying its agent has not connected.
    """

    def __init__(self, endpoint: str, *, connect_timeout_s: float = 5.0) -> None:
        if not connect_timeout_s >= 0:
            raise KvPoolError(f"KvPoolController connect_timeout_s must be >= 0, got {connect_timeout_s}")
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        # An unknown identity is an error we can wait on and name, not a silent drop.
        self._socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._socket.bind(endpoint)
        self.endpoint = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.connect_timeout_s = connect_timeout_s
        self.latest: dict[str, KvPoolStats] = {}

    def receive(self, timeout_s: float = 0.0) -> list[tuple[str, KvPoolStats]]:
        """Stats that arrived within `timeout_s` (all that are queued, at least one if any comes)."""
        got: list[tuple[str, KvPoolStats]] = []
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            if not got and not self._socket.poll(int(remaining * 1000)):
                return got
            if got and not self._socket.poll(0):
                return got
            frames = self._socket.recv_multipart()
            if len(frames) != 2 or (stats := read_frame(frames[1], KvPoolStats)) is None:
                continue
            try:
                pool = frames[0].decode()   # an identity that is not text names no pool we resize
            except UnicodeDecodeError:
                continue
            self.latest[pool] = stats
            got.append((pool, stats))

    def wait_for(self, pool: str, predicate, timeout_s: float) -> KvPoolStats:
        """Stats of `pool` that satisfy predicate(stats); KvPoolTimeout after timeout_s (the argument)."""
        deadline = time.monotonic() + timeout_s
        stats = self.latest.get(pool)
        while stats is None or not predicate(stats):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KvPoolTimeout(f"pool {pool!r} did not report the expected stats within {timeout_s} s "
                                    f"(wait_for timeout_s); last: {stats}")
            for name, s in self.receive(min(remaining, 0.1)):
                if name == pool:
                    stats = s
        return stats

    def resize(self, pool: str, target_bytes: int | None, request_id: str = "", *,
               connect_timeout_s: float | None = None) -> None:
        """Ask `pool` to resize toward `target_bytes` (None: only report its stats).

        A pool whose agent is not connected (yet) is waited for, at most `connect_timeout_s`
        (default: the controller's); then KvPoolError names the pool and says so."""
        self._send(pool, KvPoolResize(target_bytes=target_bytes, request_id=request_id), connect_timeout_s)

    def _send(self, pool: str, message: KvPoolResize, connect_timeout_s: float | None) -> None:
        timeout_s = self.connect_timeout_s if connect_timeout_s is None else connect_timeout_s
        frames = [pool.encode(), *wire.encode(message)]
        deadline = time.monotonic() + timeout_s
        pause = 0.001
        while True:
            try:
                self._socket.send_multipart(frames)
                return
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise KvPoolError(f"pool {pool!r}: the request could not be sent on {self.endpoint}: "
                                      f"{exc}") from None
            # No route to the identity yet: the first frame was refused, so nothing was queued and
            # sending again is safe. The route appears when the agent's handshake completes.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KvPoolError(self._not_connected(pool, timeout_s))
            time.sleep(min(pause, remaining))
            pause = min(2 * pause, 0.05)

    def _not_connected(self, pool: str, timeout_s: float) -> str:
        agent = ("its agent, which reported stats before, has disconnected (it stopped, or its process "
                 "died) and has not connected again" if pool in self.latest else "its agent has not connected")
        return (f"pool {pool!r} is not connected to {self.endpoint}: {agent} within {timeout_s:g} s "
                f"(KvPoolController connect_timeout_s); a pool's PoolControlAgent or PoolAgentProcess "
                f"connects to this endpoint with identity {pool!r}")

    def close(self) -> None:
        self._socket.close(linger=0)
