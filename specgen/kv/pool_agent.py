"""The pool's control agent in a process of its own, and the pool's native give-back thread behind it.

A `RemoteKvPool` in an engine's process shares that process's interpreter with the threads that load
and store blocks without pause. A control agent there (`pool_control.PoolControlAgent`) needs the
interpreter to take a resize off its socket, and on a busy GPU host that wait was most of a profiler's
wait for the memory (tens to over a hundred milliseconds). Here nothing between the request and the
free needs that interpreter:

    scheduler (KvPoolController) --ZeroMQ--> agent process --SOCK_SEQPACKET--> give-back thread
                                                                                (C++, PoolServer)
                                                                                -> PoolCore.shrink

`PoolAgentProcess(pool, endpoint)` starts both: the native thread (csrc/pool_server.h) on one end of a
socket pair, and `python -m specgen.kv.pool_agent` on the other. The agent speaks the same control
channel as `PoolControlAgent` (a DEALER with the pool's identity, `KvPoolResize` in, `KvPoolStats`
out after each resize and every `stats_interval_s`); it forwards each resize as a fixed-size record
and builds the stats from the counters the thread sends back. The agent exits when the pool's end of
the pair closes (the pool stopped serving, or its process died).

Only memory the pool allocated (`grow`) is given back this way; segments lent by another process
(`attach`) are closed by their Python owner, through `RemoteKvPool.shrink`.
"""
from __future__ import annotations

import argparse
import logging
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import zmq

from specgen.kv.pool_control import PoolControlClient
from specgen.kv.pool_errors import KvPoolError
from specgen.messages import KvPoolStats

if TYPE_CHECKING:
    from specgen.kv.pool import RemoteKvPool

log = logging.getLogger(__name__)

# Mirrors csrc/pool_server.h (native byte order: both ends are on one host).
OP_RESIZE, OP_STATS = 1, 2
NO_TARGET = -(1 << 63)
STATUS = {0: "ok", 1: "timed out", 2: "failed"}
REPLY_DEVICES = 8
REQUEST = struct.Struct("=3q")
COUNTERS = ("capacity_bytes", "segments", "grows", "shrinks", "late_misses", "inflight",
            "entries", "capacity_blocks", "pinned", "hits", "misses", "stores", "loads", "evictions", "moves")
TIMES = ("received_s", "began_s", "ended_s", "retire_ms", "wait_ms", "free_ms")
REPLY = struct.Struct(f"=2q{len(COUNTERS)}qq{REPLY_DEVICES}q{REPLY_DEVICES}q{len(TIMES)}d3q240s")


def decode_reply(data: bytes) -> dict:
    """A reply record as a dict (counters, `bytes_by_device`, times, `status`, `message`)."""
    if len(data) != REPLY.size:
        raise KvPoolError(f"pool reply of {len(data)} bytes; expected {REPLY.size} (csrc/pool_server.h PoolReply)")
    values = REPLY.unpack(data)
    seq, status, rest = values[0], values[1], values[2:]
    out = dict(zip(COUNTERS, rest[:len(COUNTERS)]))
    rest = rest[len(COUNTERS):]
    ndevices, devices, nbytes = rest[0], rest[1:1 + REPLY_DEVICES], rest[1 + REPLY_DEVICES:1 + 2 * REPLY_DEVICES]
    out["bytes_by_device"] = {int(devices[i]): int(nbytes[i]) for i in range(min(ndevices, REPLY_DEVICES))}
    rest = rest[1 + 2 * REPLY_DEVICES:]
    out.update(zip(TIMES, rest[:len(TIMES)]))
    out["passes"], out["freed_bytes"], out["added_bytes"] = rest[len(TIMES):len(TIMES) + 3]
    out.update(seq=seq, status=STATUS.get(status, f"status {status}"),
               message=rest[-1].split(b"\0", 1)[0].decode(errors="replace"))
    return out


class PoolLink:
    """The agent's end of the socket pair: one request, one reply."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._seq = 0

    def ask(self, op: int, target_bytes: int | None = None) -> dict:
        self._seq += 1
        self.sock.send(REQUEST.pack(op, self._seq, NO_TARGET if target_bytes is None else int(target_bytes)))
        data = self.sock.recv(REPLY.size + 1)
        if not data:
            raise EOFError("the pool stopped serving")
        reply = decode_reply(data)
        if reply["seq"] != self._seq:
            raise KvPoolError(f"pool reply {reply['seq']} to request {self._seq}")
        return reply


def stats_of(reply: dict, *, pool_id: str, slot_bytes: int, devices: list[int]) -> KvPoolStats:
    from specgen.kv.pool import pool_stats   # the one mapping of a pool's counters to its stats

    counters = {k: reply[k] for k in COUNTERS if k != "inflight"}
    return pool_stats(**counters, bytes_by_device=reply["bytes_by_device"], pool_id=pool_id, slot_bytes=slot_bytes,
                      devices=devices)


def serve(link: PoolLink, client: PoolControlClient, *, pool_id: str, slot_bytes: int, devices: list[int],
          stats_interval_s: float) -> None:
    """The agent's loop: forward resizes, report stats, until the pool's end closes."""
    poller = zmq.Poller()
    poller.register(client.socket, zmq.POLLIN)
    poller.register(link.sock.fileno(), zmq.POLLIN)      # readable with no request out: the pool closed
    last_stats = time.monotonic() - stats_interval_s      # the first stats go out at once
    while True:
        wait_ms = max(0, int((last_stats + stats_interval_s - time.monotonic()) * 1000))
        ready = dict(poller.poll(wait_ms))
        if link.sock.fileno() in ready:
            return
        replies = []
        for request in client.poll_resize():
            reply = link.ask(OP_RESIZE, request.target_bytes)
            if reply["status"] != "ok":
                log.warning("KV pool %s: resize to %s bytes: %s: %s", pool_id, request.target_bytes, reply["status"],
                            reply["message"])
            replies.append(reply)
        if not replies and time.monotonic() - last_stats < stats_interval_s:
            continue
        reply = replies[-1] if replies else link.ask(OP_STATS)
        last_stats = time.monotonic()
        client.send_stats(stats_of(reply, pool_id=pool_id, slot_bytes=slot_bytes, devices=devices))


class PoolAgentProcess:
    """Serve `pool` on the control channel at `endpoint` from a process of its own (see the module
    docstring). `close()` stops the give-back thread; the agent then exits."""

    def __init__(self, pool: "RemoteKvPool", endpoint: str, identity: str | None = None, *,
                 stats_interval_s: float = 1.0, shrink_timeout_s: float = 30.0, start_timeout_s: float = 30.0) -> None:
        from specgen.kv.extension import kv_extension

        self.identity = identity or pool.pool_id
        if not self.identity:
            raise KvPoolError("PoolAgentProcess needs an identity (or a pool with a pool_id)")
        ext = kv_extension()
        if (REQUEST.size, REPLY.size) != (ext.POOL_REQUEST_BYTES, ext.POOL_REPLY_BYTES):
            raise KvPoolError(f"pool_agent's records ({REQUEST.size}, {REPLY.size} bytes) do not match the built "
                              f"extension's ({ext.POOL_REQUEST_BYTES}, {ext.POOL_REPLY_BYTES}): rebuild it "
                              "(pip install -e .)")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._server = ext.PoolServer(pool.native, ours.detach(), float(shrink_timeout_s))
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        command = [sys.executable, "-m", "specgen.kv.pool_agent", "--fd", str(theirs.fileno()), "--endpoint", endpoint,
                   "--identity", self.identity, "--pool-id", pool.pool_id, "--slot-bytes", str(pool.layout.slot_bytes),
                   "--devices", ",".join(str(d) for d in pool.devices), "--stats-interval-s", str(stats_interval_s)]
        try:
            self.process = subprocess.Popen(command, pass_fds=(theirs.fileno(),), env=env)
        except BaseException:
            self._server.stop()
            raise
        finally:
            theirs.close()
        self._start_timeout_s = start_timeout_s

    def wait_started(self, timeout_s: float | None = None) -> None:
        """Until the agent sent its first stats (the give-back thread answered it)."""
        deadline = time.monotonic() + (self._start_timeout_s if timeout_s is None else timeout_s)
        while self._server.served == 0:
            if self.process.poll() is not None:
                raise KvPoolError(f"the pool's agent process exited with status {self.process.returncode} "
                                  "before serving (its stderr says why)")
            if time.monotonic() > deadline:
                raise KvPoolError(f"the pool's agent process did not start within {timeout_s} s")
            time.sleep(0.01)

    def last_reply(self) -> dict:
        """The give-back thread's last answer (decode_reply): where the last resize's time went."""
        return decode_reply(self._server.last_reply())

    def close(self, timeout_s: float = 10.0) -> None:
        self._server.stop()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> "PoolAgentProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The control agent of a RemoteKvPool (started by PoolAgentProcess).")
    ap.add_argument("--fd", type=int, required=True, help="this end of the pool's socket pair")
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--identity", required=True)
    ap.add_argument("--pool-id", default="")
    ap.add_argument("--slot-bytes", type=int, required=True)
    ap.add_argument("--devices", default="")
    ap.add_argument("--stats-interval-s", type=float, default=1.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    link = PoolLink(socket.socket(fileno=args.fd))
    client = PoolControlClient(args.endpoint, args.identity)
    try:
        serve(link, client, pool_id=args.pool_id, slot_bytes=args.slot_bytes,
              devices=[int(d) for d in args.devices.split(",") if d], stats_interval_s=args.stats_interval_s)
    except (EOFError, ConnectionError):
        pass      # the pool stopped serving mid-request
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
