"""The scheduler actor process: one ROUTER socket, the scheduler core, the jobs' reasoners.

Threads: the I/O thread (SocketPump) decodes incoming frames into a queue and sends what the
loop produced; malformed frames are answered with an ErrorReply right there, so they never reach
the loop. The main thread runs the loop: take a batch of messages, feed them to the core, run the
timers, assign work, commit the journal, and only then send the batch's replies. Reasoner
processes are started and stopped here, watched by monitor threads. With the setting
`kv_control_bind`, a second ROUTER (its own I/O thread) takes remote KV pools' stats into the same
queue and sends them the resize requests the core decides (runtime/kv_steward.py).

Run as `specgen serve --bind tcp://127.0.0.1:PORT` or `python -m specgen.runtime.scheduler`.
"""
from __future__ import annotations

import argparse
import logging
import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path

import msgspec
import zmq

from specgen.errors import UsageError
from specgen.kv.pool_control import RESIZE, STATS
from specgen.messages import DeadNotice, KvPoolStats
from specgen.runtime import wire
from specgen.runtime.auth import (
    KEYS_ENV, CurveGate, ServerKeys, client_keys_to_env, ephemeral_client_keys, is_loopback,
    load_server_keys, require_keys_for,
)
from specgen.runtime.journal import Journal
from specgen.runtime.process import ChildProcess, log_tail
from specgen.runtime.scheduler_core import SchedulerCore
from specgen.runtime.settings import SETTINGS_ENV, RuntimeSettings, settings_from_env
from specgen.runtime.transport import SocketPump, configure, new_context

log = logging.getLogger("specgen.scheduler")

_STOP = object()
_TICK_S = 0.05
_kv_stats_decoder = msgspec.msgpack.Decoder(KvPoolStats)
_kv_encoder = msgspec.msgpack.Encoder()


class SchedulerActor:
    def __init__(self, bind: str, state_dir: Path, settings: RuntimeSettings,
                 keys: ServerKeys | None = None) -> None:
        require_keys_for(bind, keys)
        settings.check()   # among others: kv_control_bind must be a loopback address
        self.settings = settings
        self.state_dir = state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self.journal = Journal(state_dir / "journal.sqlite3")
        self.core = SchedulerCore(settings, self.journal)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.reasoners: dict[str, ChildProcess] = {}
        self._stopping = False
        self.rejected = 0
        self.send_failures = 0
        self.init_socket(bind, keys)
        self.init_kv_control()

    def init_socket(self, bind: str, keys: ServerKeys | None) -> None:
        self.ctx = new_context()
        self.gate = CurveGate(self.ctx, keys) if keys is not None else None
        self.reasoner_keys = ephemeral_client_keys(keys) if keys is not None else None
        sock = self.ctx.socket(zmq.ROUTER)
        configure(sock, self.settings)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)   # unknown peer / full queue: an error, not a silent drop
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)    # a reconnecting peer with the same id takes over
        if self.gate is not None:
            self.gate.apply(sock)
        try:
            sock.bind(bind)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise UsageError(f"cannot bind {bind}: {exc}") from None
        self.address = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        # Children (reasoners) connect over loopback even when the scheduler listens on all interfaces.
        self.local_address = self.address.replace("0.0.0.0", "127.0.0.1").replace("[::]", "[::1]")
        self._burst: list = []
        self.pump = SocketPump(sock, "scheduler", self._on_frames, on_send_error=self._on_send_error,
                               on_burst_end=self._end_burst)

    def init_kv_control(self) -> None:
        """The remote KV pools' control channel (setting kv_control_bind; None leaves it off)."""
        self.kv_pump: SocketPump | None = None
        self.kv_address = ""
        self.kv_rejected = 0
        self.kv_send_failures = 0
        bind = self.settings.kv_control_bind
        if bind is None:
            return
        sock = self.ctx.socket(zmq.ROUTER)
        configure(sock, self.settings)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)   # a pool that left: an error we count, not a silent drop
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)    # a restarted engine's pool keeps its identity
        try:
            sock.bind(bind)
        except zmq.ZMQError as exc:
            sock.close(0)
            self.pump.stop()
            raise UsageError(f"cannot bind {bind} (setting kv_control_bind): {exc}") from None
        self.kv_address = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.core.kv_endpoint = self.kv_address
        self.kv_pump = SocketPump(sock, "scheduler-kv", self._on_kv_frames, on_send_error=self._on_kv_send_error)

    # -- I/O threads ----------------------------------------------------------------------
    def _on_kv_frames(self, frames: list[bytes]) -> None:
        # [pool identity, b"stats", msgpack KvPoolStats]; the channel has no error reply, so a bad
        # frame is counted and logged.
        if len(frames) == 3 and frames[1] == STATS:
            try:
                stats = _kv_stats_decoder.decode(frames[2])
            except msgspec.DecodeError as exc:
                self.kv_rejected += 1
                log.warning("KV control: bad stats from %r: %s", frames[0][:40], exc)
                return
            self.inbox.put(("kv_stats", frames[0], stats))
            return
        self.kv_rejected += 1
        log.warning("KV control: ignored a message of %d frames from %r (expected [b'stats', body])",
                    len(frames), frames[0][:40])

    def _on_kv_send_error(self, frames: list, exc: zmq.ZMQError) -> None:
        self.kv_send_failures += 1
        identity = bytes(frames[0])
        log.warning("KV control: pool %r unreachable (%s); the request is sent again when it reports",
                    identity[:40], exc)
        self.inbox.put(("kv_send_failed", identity))

    def _on_frames(self, frames: list[bytes]) -> None:
        peer = frames[0]
        try:
            msg = wire.decode(frames[1:], self.settings.max_message_bytes)
        except wire.WireError as exc:
            self.rejected += 1
            log.warning("refused a message from %r: %s", peer[:40], exc.message)
            self.pump.send([peer, *wire.encode(exc.reply())])
            return
        self._burst.append((peer, msg))

    def _end_burst(self) -> None:
        # One hand-over per burst, not per message: under load the loop takes many at once.
        if self._burst:
            burst, self._burst = self._burst, []
            self.inbox.put(burst)

    def _on_send_error(self, frames: list, exc: zmq.ZMQError) -> None:
        # EHOSTUNREACH: the peer is gone; EAGAIN: its queue is full (a subscriber not reading).
        self.send_failures += 1

    # -- reasoners ------------------------------------------------------------------------
    def _reasoner_exited(self, child: ChildProcess, code: int) -> None:
        self.inbox.put(("exited", child, code))

    def _start_reasoner(self, job_id: str) -> None:
        old = self.reasoners.pop(job_id, None)
        if old is not None and old.alive():
            old.stop(self.settings.shutdown_grace_s)
        env = {SETTINGS_ENV: self.settings.to_env(), **client_keys_to_env(self.reasoner_keys)}
        child = ChildProcess(
            f"reasoner-{job_id}", "specgen.runtime.reasoner",
            ["--scheduler", self.local_address, "--job-id", job_id], env=env,
            on_exit=self._reasoner_exited, log_path=self.state_dir / "logs" / f"{job_id}.log",
        )
        self.reasoners[job_id] = child
        child.start()
        log.info("job %s: reasoner started (pid %s)", job_id, child.pid)

    def _stop_reasoner(self, job_id: str) -> None:
        child = self.reasoners.pop(job_id, None)
        if child is not None and child.alive():
            child.stopping = True
            threading.Thread(target=child.stop, args=(self.settings.shutdown_grace_s,), daemon=True).start()

    # -- main loop ------------------------------------------------------------------------
    def request_stop(self, *_: object) -> None:
        self.inbox.put(_STOP)

    def run(self) -> None:
        self.pump.start()
        if self.kv_pump is not None:
            self.kv_pump.start()
            (self.state_dir / "kv_control_address").write_text(self.kv_address + "\n")
            log.info("KV pools' control channel on %s", self.kv_address)
        # Where it listens, for tools that bound an ephemeral port (tcp://127.0.0.1:*).
        (self.state_dir / "address").write_text(self.address + "\n")
        log.info("scheduler %s listening on %s (state in %s)", self.core.scheduler_id, self.address, self.state_dir)
        core = self.core
        self._flush()
        next_tick = time.monotonic()
        try:
            self._loop(next_tick)
        except Exception as exc:
            # Tell every peer at once (their calls fail now, not at their timeouts); the journal
            # holds everything committed, so a restart resumes from there.
            log.exception("scheduler failed")
            dead = wire.encode(DeadNotice(name="scheduler", reason=f"{type(exc).__name__}: {exc}"))
            for peer in list(core.peers):
                self.pump.send([peer, *dead])
            raise

    def _loop(self, next_tick: float) -> None:
        core = self.core
        running = True
        while running:
            try:
                first = self.inbox.get(timeout=max(0.0, next_tick - time.monotonic()))
                batch = [first]
            except queue.Empty:
                batch = []
            while len(batch) < 64:
                try:
                    batch.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            now = time.monotonic()
            for item in batch:
                if type(item) is list:
                    for peer, msg in item:
                        core.handle(peer, msg, now)
                elif item is _STOP:
                    running = False
                elif item[0] == "kv_stats":
                    core.on_kv_stats(item[1], item[2], now)
                elif item[0] == "kv_send_failed":
                    core.kv_send_failed(item[1])
                elif item[0] == "exited":
                    _, child, code = item
                    job_id = child.name.removeprefix("reasoner-")
                    if self.reasoners.get(job_id) is child:
                        del self.reasoners[job_id]
                        if not child.stopping:
                            core.reasoner_exited(job_id, code, log_tail(child.log_path), now)
            if now >= next_tick:
                core.tick(now)
                next_tick = now + _TICK_S
            core.schedule(now)
            self._flush()

    def _flush(self) -> None:
        """Commit, then send: a peer is never told something a restart could forget."""
        self.journal.commit()
        core = self.core
        if core.outbox:
            send = self.pump.send
            encode = wire.encode
            for peer, msg in core.outbox:
                send([peer, *encode(msg)])
            core.outbox.clear()
        if core.kv_outbox:
            requests, core.kv_outbox = core.kv_outbox, []
            if self.kv_pump is not None:
                for identity, request in requests:
                    log.info("KV pool %s: resize to %s bytes (%s)", identity.decode(errors="replace"),
                             request.target_bytes, request.request_id)
                    self.kv_pump.send([identity, RESIZE, _kv_encoder.encode(request)])
        if core.actions:
            actions, core.actions = core.actions, []
            for action, job_id in actions:
                if action == "start_reasoner":
                    self._start_reasoner(job_id)
                else:
                    self._stop_reasoner(job_id)

    def close(self) -> None:
        """Stop reasoners (jobs stay 'running' in the journal and resume on the next start)."""
        self._stopping = True
        children = list(self.reasoners.values())
        for child in children:
            child.stopping = True
        threads = [threading.Thread(target=c.stop, args=(self.settings.shutdown_grace_s,)) for c in children]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.journal.close()
        self.pump.stop()
        if self.kv_pump is not None:
            self.kv_pump.stop()
        if self.gate is not None:
            self.gate.stop()
        self.ctx.term()
        log.info("scheduler stopped")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bind", default="tcp://127.0.0.1:5555",
                        help="address to listen on (default tcp://127.0.0.1:5555); non-loopback needs --keys")
    parser.add_argument("--state-dir", type=Path, default=Path.home() / ".local" / "state" / "specgen" / "scheduler",
                        help="journal of jobs and verdicts; a restart resumes from it "
                             "(default ~/.local/state/specgen/scheduler)")
    parser.add_argument("--keys", type=Path, default=os.environ.get(KEYS_ENV) or None,
                        help="CURVE key directory (server.key_secret, authorized/); see `specgen keys`")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a runtime setting (see specgen/runtime/settings.py)")


def serve(args: argparse.Namespace) -> int:
    settings = settings_from_env().with_overrides(args.set)
    keys = load_server_keys(args.keys) if args.keys else None
    if keys is None and not is_loopback(args.bind):
        require_keys_for(args.bind, None)
    actor = SchedulerActor(args.bind, args.state_dir, settings, keys)
    signal.signal(signal.SIGTERM, actor.request_stop)
    signal.signal(signal.SIGINT, actor.request_stop)
    print(f"specgen scheduler listening on {actor.address}", flush=True)
    try:
        actor.run()
    finally:
        actor.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(prog="python -m specgen.runtime.scheduler")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return serve(args)
    except UsageError as exc:
        print(f"specgen serve: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
