"""The scheduler actor process: one ROUTER socket, the scheduler core, the jobs' reasoners.

The main thread runs the loop and alone touches the sockets: wait for a message, take a batch
(malformed frames are answered with an ErrorReply there and never reach the core), feed it to the
core, run the timers, commit the journal and only then send the replies; then assign work and send
the assignments, again after a commit.
ZeroMQ's own I/O threads do the network I/O, so the loop never blocks on a peer, and it is never
busy for long (a decision takes microseconds), so no Python I/O thread stands between it and its
peers (see runtime/transport.py). Reasoner processes are started and stopped here, watched by
monitor threads that post their exits to an inbox the loop reads within a tick. With the setting
`kv_control_bind`, a second ROUTER takes remote KV pools' stats and sends them the resize requests
the core decides (runtime/kv_steward.py).

Run as `specgen serve --bind tcp://127.0.0.1:PORT` or `python -m specgen.runtime.scheduler`.
Workers, nodes and reasoners register only with credentials derived from the cluster's join
secret (`--join-secret FILE`, default STATE_DIR/join_secret, made on the first start; see
runtime/auth.py); the reasoners started here get theirs through their secrets pipe. A client acts
for its own jobs only (runtime/ownership.py); with CURVE the loop hands the core each message's
authenticated key for that.
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

import zmq

from specgen.clock import SYSTEM_CLOCK, Clock
from specgen.errors import UsageError
from specgen.messages import DeadNotice, KvPoolStats
from specgen.runtime import wire
from specgen.runtime.auth import (
    DEFAULT_STATE_DIR, JOIN_SECRET_ENV, JOIN_SECRET_FILE, KEYS_ENV, CurveGate, ServerKeys, client_keys_to_text,
    ephemeral_client_keys, is_loopback, load_join_secret, load_server_keys, reasoner_credential,
    require_keys_for,
)
from specgen.runtime.child_process import (
    ChildProcess, die_with_parent, log_tail, on_signals, parent_alive, take_secrets,
)
from specgen.runtime.journal import Journal
from specgen.runtime.plugins import load_plugins
from specgen.runtime.private_files import make_private_dir, write_private
from specgen.runtime.scheduler_core import SchedulerCore
from specgen.runtime.scheduler_metrics import SchedulerMetrics
from specgen.runtime.settings import SETTINGS_ENV, RuntimeSettings, settings_from_env
from specgen.runtime.socket_io import NOBLOCK, POLLIN, recv_frame, send_frames
from specgen.runtime.transport import configure, new_context

log = logging.getLogger("specgen.scheduler")

_STOP = object()
_TICK_S = 0.05
_ALREADY_WAITING_S = 20e-6   # a receive that returned this fast found its message queued


def _user_id(frame: zmq.Frame) -> str:
    """The ZAP user id of a CURVE connection's message (pyzmq's authenticator: the client's public
    key, z85). Every message of an authenticated connection has one; "" should one ever lack it."""
    try:
        return frame.get("User-Id")
    except zmq.ZMQError:
        return ""


class SchedulerActor:
    batch_limit = 1024   # messages handled per receive at most, before replies and assignments go out

    def __init__(self, bind: str, state_dir: Path, settings: RuntimeSettings,
                 keys: ServerKeys | None = None, join_secret: bytes | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        """`join_secret`: the cluster's (runtime/auth.py); None reads STATE_DIR/join_secret,
        making it on the first start. `clock`: the time the core decides by (ticks, timeouts,
        rates); the socket waits stay on real time whatever it is."""
        require_keys_for(bind, keys)
        settings.check()   # among others: kv_control_bind must be a loopback address
        self.settings = settings
        # The journal holds every job's problem and candidates: the folder is the owner's alone.
        self.state_dir = make_private_dir(state_dir)
        if join_secret is None:
            join_secret = load_join_secret(state_dir / JOIN_SECRET_FILE, create=True)
        self.join_secret = join_secret
        self.journal = Journal(state_dir / "journal.sqlite3")
        self.clock = clock
        self.core = SchedulerCore(settings, self.journal, join_secret=join_secret, clock=clock)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()   # from other threads; see `post`
        self.reasoners: dict[str, ChildProcess] = {}
        self._stopping = False
        self.rejected = 0
        self.send_failures = 0
        self.metrics: SchedulerMetrics | None = None   # see serve_metrics
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
        self.sock = sock

    def init_kv_control(self) -> None:
        """The remote KV pools' control channel (setting kv_control_bind; None leaves it off)."""
        self.kv_sock: zmq.Socket | None = None
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
            self.sock.close(0)
            raise UsageError(f"cannot bind {bind} (setting kv_control_bind): {exc}") from None
        self.kv_address = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.core.kv_endpoint = self.kv_address
        self.kv_sock = sock

    # -- sockets (the loop's thread only) -----------------------------------------------------
    def _receive(self, now: float, peer: bytes, batch: bool) -> None:
        """Feed the core the message whose first frame (`peer`) the loop received and, with
        `batch`, what else is waiting, up to `batch_limit` messages so replies go out under a
        flood. A message is read only when it is handled here: the next one's routing frame is
        taken only when the bound leaves room for it, the rest waits whole in the socket for the
        loop's next receive."""
        sock, core = self.sock, self.core
        limit = self.settings.max_message_bytes
        curve = self.gate is not None
        for left in range(self.batch_limit - 1, -1, -1):
            # A ROUTER hands over a message whole: no wait here. Frames (copy=False) say whether
            # more follow without a getsockopt, whose option lookup costs more than the receive.
            frame = recv_frame(sock, 0, False)
            # With CURVE, the key ZAP authenticated the sender's connection with (its User-Id):
            # whose jobs it may act for (runtime/ownership.py).
            curve_key = _user_id(frame) if curve else None
            frames = [frame.buffer]
            while frame.more:
                frame = recv_frame(sock, 0, False)
                frames.append(frame.buffer)
            try:
                msg = wire.decode(frames, limit)
            except wire.WireError as exc:
                self.rejected += 1
                log.warning("refused a message from %r: %s", peer[:40], exc.message)
                self._send([peer, *wire.encode(exc.reply())])
            else:
                core.handle(peer, msg, now, curve_key)
            if not left or not batch or not sock.getsockopt(zmq.EVENTS) & POLLIN:   # cheaper than a failed recv
                return
            peer = recv_frame(sock, NOBLOCK)

    def _receive_kv(self, now: float) -> None:
        # [pool identity, KvPoolStats framed by specgen.wire]; the channel has no error reply, so a
        # bad frame is counted and logged.
        assert self.kv_sock is not None
        limit = self.settings.max_message_bytes
        for _ in range(1024):
            try:
                frames = self.kv_sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                stats = wire.decode(frames[1:], limit)
            except wire.WireError as exc:
                self.kv_rejected += 1
                log.warning("KV control: bad stats from %r: %s", frames[0][:40], exc.message)
                continue
            if type(stats) is not KvPoolStats:
                self.kv_rejected += 1
                log.warning("KV control: ignored a %s from %r (expected KvPoolStats)",
                            type(stats).__name__, frames[0][:40])
                continue
            self.core.on_kv_stats(frames[0], stats, now)

    def _send(self, frames: list) -> None:
        try:
            send_frames(self.sock, frames)
        except zmq.ZMQError:
            # ROUTER_MANDATORY: EHOSTUNREACH, the peer is gone; EAGAIN, its queue is full (a
            # subscriber not reading). Either way the peer's own recovery takes over.
            self.send_failures += 1

    def _send_kv(self, identity: bytes, frames: list) -> None:
        assert self.kv_sock is not None
        try:
            send_frames(self.kv_sock, frames)
        except zmq.ZMQError as exc:
            self.kv_send_failures += 1
            log.warning("KV control: pool %r unreachable (%s); the request is sent again when it reports",
                        identity[:40], exc)
            self.core.kv_send_failed(identity)

    def post(self, item: object) -> None:
        """Hand an item to the loop from another thread (or a signal handler); the loop takes it
        within one tick (_TICK_S)."""
        self.inbox.put(item)

    # -- reasoners ------------------------------------------------------------------------
    def _reasoner_exited(self, child: ChildProcess, code: int) -> None:
        self.post(("exited", child, code))

    def _start_reasoner(self, job_id: str) -> None:
        old = self.reasoners.pop(job_id, None)
        if old is not None and old.alive():
            old.stop(self.settings.shutdown_grace_s)
        env = {SETTINGS_ENV: self.settings.to_env()}
        start = self.core.reasoner_start(job_id) or 1
        secrets = {"credential": reasoner_credential(self.join_secret, job_id, start)}
        if self.reasoner_keys is not None:
            secrets["curve"] = client_keys_to_text(self.reasoner_keys)
        child = ChildProcess(
            f"reasoner-{job_id}", "specgen.runtime.reasoner",
            # The job's folder outlives its reasoners: a restarted one continues from what the
            # last one journaled there.
            ["--scheduler", self.local_address, "--job-id", job_id,
             "--run-dir", str(self.state_dir / "jobs" / job_id)], env=env,
            on_exit=self._reasoner_exited, log_path=self.state_dir / "logs" / f"{job_id}.log",
            secrets=secrets,
        )
        self.reasoners[job_id] = child
        child.start()
        log.info("job %s: reasoner started (pid %s)", job_id, child.pid)

    def _stop_reasoner(self, job_id: str) -> None:
        child = self.reasoners.pop(job_id, None)
        if child is not None and child.alive():
            child.stopping = True
            threading.Thread(target=child.stop, args=(self.settings.shutdown_grace_s,), daemon=True).start()

    def serve_metrics(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve Prometheus metrics on addr:port (0: a free port) from now on; returns the port."""
        self.metrics = SchedulerMetrics()
        self.core.feedback_observer = self.metrics.observe_feedback
        now = self.clock.now()
        self.metrics.update(self.core.stats(now), now)
        return self.metrics.serve(port, addr)

    # -- main loop ------------------------------------------------------------------------
    def request_stop(self, *_: object) -> None:
        self.post(_STOP)

    def run(self) -> None:
        if self.kv_sock is not None:
            write_private(self.state_dir / "kv_control_address", self.kv_address + "\n")
            log.info("KV pools' control channel on %s", self.kv_address)
        # Where it listens, for tools that bound an ephemeral port (tcp://127.0.0.1:*).
        write_private(self.state_dir / "address", self.address + "\n")
        log.info("scheduler %s listening on %s (state in %s)", self.core.scheduler_id, self.address, self.state_dir)
        core = self.core
        self._flush()
        next_tick = self.clock.now()
        try:
            self._loop(next_tick)
        except Exception as exc:
            # Tell every peer at once (their calls fail now, not at their timeouts); the journal
            # holds everything committed, so a restart resumes from there.
            log.exception("scheduler failed")
            dead = wire.encode(DeadNotice(name="scheduler", reason=f"{type(exc).__name__}: {exc}"))
            for peer in list(core.registry.peers):
                self._send([peer, *dead])
            raise

    def _loop(self, next_tick: float) -> None:
        core, sock = self.core, self.sock
        # The loop waits in a blocking receive (with a timeout of one tick), the cheapest wait
        # libzmq has: no poll set to build and check on each wake-up. Its other inputs wait for
        # the tick: the inbox (a reasoner exited, a stop was asked for: a signal handler cannot
        # wake a socket) and the KV pools' stats (a few a second, nothing waits on them).
        sock.setsockopt(zmq.RCVTIMEO, int(_TICK_S * 1000))
        running = True
        while running:
            # Whether the receive waited is a fact about the socket, so it is measured on real
            # time (as is RCVTIMEO); what the core decides goes by the injected clock.
            waited_from = time.monotonic()
            try:
                peer = recv_frame(sock, 0)
            except zmq.Again:
                peer = None
            already_waiting = time.monotonic() - waited_from < _ALREADY_WAITING_S
            now = self.clock.now()
            if peer is not None:
                # A message that was already waiting means load: take the whole batch (one
                # journal commit for all of it). One that woke an idle loop is answered at once,
                # without first asking the socket for more.
                self._receive(now, peer, batch=already_waiting)
            if not self.inbox.empty():
                running = self._handle_inbox(now)
            if now >= next_tick:
                if self.kv_sock is not None:
                    self._receive_kv(now)
                core.tick(now)
                if self.metrics is not None and self.metrics.due(now):
                    self.metrics.update(core.stats(now), now)
                next_tick = now + _TICK_S
            if core.outbox:
                # Replies to what was just handled (a result's answer to its client) go out
                # before the next assignments are worked out; each send follows its commit.
                self._flush()
            core.schedule(now)
            self._flush()

    def _handle_inbox(self, now: float) -> bool:
        """Items other threads posted; False once a stop was asked for."""
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return True
            if item is _STOP:
                return False
            _, child, code = item   # ("exited", child, code)
            job_id = child.name.removeprefix("reasoner-")
            if self.reasoners.get(job_id) is child:
                del self.reasoners[job_id]
                if not child.stopping:
                    self.core.reasoner_exited(job_id, code, log_tail(child.log_path), now)

    def _flush(self) -> None:
        """Commit, then send: a peer is never told something a restart could forget."""
        self.journal.commit()
        core = self.core
        if core.outbox:
            send = self._send
            encode = wire.encode
            for peer, msg in core.outbox:
                send([peer, *encode(msg)])
            core.outbox.clear()
        if core.kv_outbox:
            requests, core.kv_outbox = core.kv_outbox, []
            if self.kv_sock is not None:
                for identity, request in requests:
                    log.info("KV pool %s: resize to %s bytes (%s)", identity.decode(errors="replace"),
                             request.target_bytes, request.request_id)
                    self._send_kv(identity, [identity, *wire.encode(request)])
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
        if self.metrics is not None:
            self.metrics.close()
        self.journal.close()
        self.sock.close(linger=200)
        if self.kv_sock is not None:
            self.kv_sock.close(linger=200)
        if self.gate is not None:
            self.gate.stop()
        self.ctx.term()
        log.info("scheduler stopped")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bind", default="tcp://127.0.0.1:5555",
                        help="address to listen on (default tcp://127.0.0.1:5555); non-loopback needs --keys")
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                        help="journal of jobs and verdicts; a restart resumes from it "
                             "(default ~/.local/state/specgen/scheduler)")
    parser.add_argument("--keys", type=Path, default=os.environ.get(KEYS_ENV) or None,
                        help="CURVE key directory (server.key_secret, authorized/); see `specgen keys`")
    parser.add_argument("--join-secret", type=Path, default=os.environ.get(JOIN_SECRET_ENV) or None,
                        metavar="FILE",
                        help="the cluster's join secret, from which workers, nodes and reasoners "
                             f"derive their credentials; made (mode 0600) when missing (default "
                             f"STATE_DIR/{JOIN_SECRET_FILE}, or ${JOIN_SECRET_ENV}); give the same "
                             "file to every specgen-node")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a runtime setting (see specgen/runtime/settings.py)")
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve Prometheus metrics on http://METRICS_BIND:PORT/metrics (0: a free "
                             "port, written to STATE_DIR/metrics_address); off by default")
    parser.add_argument("--metrics-bind", default="127.0.0.1",
                        help="address the metrics server listens on (default 127.0.0.1)")
    # A LocalCluster's private directory, removed by this process if its parent dies (local.py).
    parser.add_argument("--remove-if-orphaned", type=Path, default=None, help=argparse.SUPPRESS)


def serve(args: argparse.Namespace) -> int:
    settings = settings_from_env().with_overrides(args.set)
    keys = load_server_keys(args.keys) if args.keys else None
    if keys is None and not is_loopback(args.bind):
        require_keys_for(args.bind, None)
    given = take_secrets().get("join_secret")   # a LocalCluster's, never written to disk
    if given:
        join_secret, source = bytes.fromhex(given), "from the parent process"
    else:
        path = args.join_secret or args.state_dir / JOIN_SECRET_FILE
        join_secret, source = load_join_secret(path, create=True), f"in {path}"
    actor = SchedulerActor(args.bind, args.state_dir, settings, keys, join_secret)
    orphaned = False

    def on_signal(signum: int) -> None:
        nonlocal orphaned
        orphaned = orphaned or signum == signal.SIGHUP   # PR_SET_PDEATHSIG: the parent died
        actor.request_stop()

    on_signals(on_signal, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
    print(f"specgen scheduler listening on {actor.address}", flush=True)
    if args.metrics_port is not None:
        try:
            port = actor.serve_metrics(args.metrics_port, args.metrics_bind)
        except OSError as exc:
            actor.close()
            raise UsageError(f"cannot serve metrics on {args.metrics_bind}:{args.metrics_port}: {exc}") from None
        url = f"http://{args.metrics_bind}:{port}/metrics"
        write_private(args.state_dir / "metrics_address", url + "\n")
        print(f"metrics on {url}", flush=True)
    log.info("workers and nodes join with the cluster secret %s", source)
    try:
        actor.run()
    finally:
        actor.close()
        # The parent-death signal comes when the thread that started us exits, which can be before
        # its process is gone and we are reparented: the signal says so, getppid() may not yet.
        if args.remove_if_orphaned is not None and (orphaned or not parent_alive()):
            from specgen.runtime.local import remove_orphaned_cluster_dir

            remove_orphaned_cluster_dir(args.remove_if_orphaned, settings)
    return 0


def main(argv: list[str] | None = None) -> int:
    # A LocalCluster's scheduler ends with the process that started it; SIGHUP (not the SIGTERM of
    # an orderly stop) tells it that its parent died, so it removes the cluster's directory.
    die_with_parent(signal.SIGHUP)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(prog="python -m specgen.runtime.scheduler")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        take_secrets()    # first, so that a plug-in's code never reads the secrets pipe
        load_plugins()
        return serve(args)
    except UsageError as exc:
        print(f"specgen serve: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
