"""`specgen-node`: runs and supervises the evaluation workers of one host.

    specgen-node --scheduler tcp://HOST:PORT [--gpus 0,1] [--cpu-workers N] [--name NAME] [--keys DIR]
                 [--join-secret FILE]

One worker process per GPU (`--gpus`, or every GPU `nvidia-smi -L` lists; a GPU named several
times, `--gpus 0,0`, gets that many workers sharing it), or `--cpu-workers N` CPU workers on a host
without GPUs. Each worker connects to the scheduler itself; the node starts
it, waits for its READY (setting `ready_timeout_s`), restarts it when it dies (after
`worker_restart_backoff_s`, at most `worker_max_restarts` times in 10 minutes, not counting deaths
while it judged a candidate: those are the candidate's, and the scheduler fails a candidate that
loses `max_request_attempts` workers), tells the scheduler
at once when one exits (so its request is re-queued without waiting for a heartbeat timeout), and
reports the health of its workers in its heartbeats. SIGTERM/SIGINT stop every worker (SIGTERM,
join, SIGKILL) and the node; SIGKILL of the node takes its workers down with it.

The node holds the cluster's join secret (`--join-secret FILE`, the file `specgen serve` names;
see runtime/auth.py) and gives each worker only its own credential, derived from it, through the
worker's secrets pipe, with its CURVE keys; the node's environment keeps neither, so nothing the
workers start (evaluation runners) inherits them.
"""
from __future__ import annotations

import argparse
import collections
import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import zmq

from specgen.errors import UsageError
from specgen.messages import DeadNotice, Goodbye, WorkerExited, WorkerReady
from specgen.runtime import wire
from specgen.runtime.auth import (
    DEFAULT_STATE_DIR, JOIN_SECRET_ENV, JOIN_SECRET_FILE, KEYS_ENV, ClientKeys, client_keys_from_env,
    client_keys_to_text, load_client_keys, load_join_secret, peer_credential, present_credential,
    require_keys_for,
)
from specgen.runtime.child_process import ChildProcess, die_with_parent, log_tail, on_signals, take_secrets
from specgen.runtime.plugins import load_plugins
from specgen.runtime.settings import SETTINGS_ENV, RuntimeSettings
from specgen.runtime.transport import PeerConnection, SocketReader
from specgen.runtime.worker import CONFIG_ENV, WorkerConfig, in_flight

log = logging.getLogger("specgen.node")

_STOP = object()
_RESTART_WINDOW_S = 600.0


@dataclass
class WorkerSlot:
    name: str
    device: str
    state: str = "stopped"                  # starting | ready | restarting | failed | stopped
    child: ChildProcess | None = None
    started_at: float = 0.0
    restart_at: float | None = None
    restarts: collections.deque = field(default_factory=collections.deque)
    last_error: str = ""
    candidate_deaths: int = 0               # deaths while judging a candidate (not in `restarts`)


def detect_gpus() -> list[int]:
    """GPU indices from `nvidia-smi -L` (no torch import: the node must start fast)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [i for i, line in enumerate(l for l in out.splitlines() if l.startswith("GPU "))]


class NodeActor:
    def __init__(
        self,
        scheduler: str,
        name: str,
        devices: list[str],
        settings: RuntimeSettings,
        keys: ClientKeys | None = None,
        evaluator: str = "eval",
        work_dir: Path | None = None,
        join_secret: bytes | None = None,
    ) -> None:
        """`join_secret`: the cluster's (runtime/auth.py); the node and its workers register with
        credentials derived from it (None: with none, for a scheduler that asks for none)."""
        require_keys_for(scheduler, keys)
        self.scheduler = scheduler
        self.name = name
        self.settings = settings
        self.keys = keys
        self.join_secret = join_secret
        if join_secret is not None:
            present_credential("node", name, peer_credential(join_secret, "node", name))
        self.evaluator = evaluator
        self.run_dir = Path(tempfile.mkdtemp(prefix="specgen-node-"))
        self.work_dir = work_dir or self.run_dir / "work"
        if settings.eval_options.cache_dir is None:
            # One build and reference-timing cache per node: a kernel built or a reference timed by
            # one worker is not built or timed again by its neighbours (the cache keys by device).
            self.settings = msgspec.structs.replace(settings, eval_options=msgspec.structs.replace(
                settings.eval_options, cache_dir=str(self.work_dir / "cache")))
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.stopping = False
        self.init_slots(devices)
        self.init_sockets()

    def init_slots(self, devices: list[str]) -> None:
        self.slots: dict[str, WorkerSlot] = {}
        for i, device in enumerate(devices):
            label = f"gpu{device.split(':')[1]}" if device.startswith("cuda:") else f"cpu{i}"
            if device.startswith("cuda:") and devices.count(device) > 1:
                # Several workers may share one large GPU (`--gpus 0,0,0,0`): one name each.
                label += f".{devices[:i].count(device)}"
            slot = WorkerSlot(name=f"{self.name}/{label}", device=device)
            self.slots[slot.name] = slot
        self.cpu_workers = sum(1 for d in devices if d == "cpu")

    def init_sockets(self) -> None:
        self.ctx = zmq.Context()
        self.notices_address = f"ipc://{self.run_dir}/notices.sock"
        pull = self.ctx.socket(zmq.PULL)
        pull.bind(self.notices_address)
        self.notice_reader = SocketReader(pull, f"node-{self.name}-notices", self._on_notice)
        self.conn = PeerConnection(self.scheduler, "node", self.name, self.settings, self.keys,
                                   heartbeat_fields=self._health, ctx=self.ctx)

    # -- I/O threads ----------------------------------------------------------------------
    def _on_notice(self, frames: list[bytes]) -> None:
        try:
            msg = wire.decode(frames, self.settings.max_message_bytes)
        except wire.WireError as exc:
            log.warning("bad notice from a worker: %s", exc.message)
            return
        self.inbox.put(("notice", msg))

    def _health(self) -> dict[str, Any]:
        return {"health": {slot.name: {"state": slot.state, "pid": slot.child.pid if slot.child else 0,
                                       "restarts": len(slot.restarts),
                                       "candidate_deaths": slot.candidate_deaths,
                                       "error": slot.last_error[-300:]}
                           for slot in self.slots.values()}}

    def _child_exited(self, child: ChildProcess, code: int) -> None:
        self.inbox.put(("exited", child, code))

    # -- supervision (main thread only: PR_SET_PDEATHSIG is tied to the thread that forks) ----
    def worker_config(self, slot: WorkerSlot) -> WorkerConfig:
        # Workers sharing a GPU split its memory (EvalWorker's gpu_sharers).
        sharers = sum(s.device == slot.device for s in self.slots.values()) if slot.device != "cpu" else 1
        return WorkerConfig(name=slot.name, node=self.name, device=slot.device, scheduler=self.scheduler,
                            node_notices=self.notices_address, evaluator=self.evaluator,
                            work_dir=str(self.worker_dir(slot)), gpu_sharers=sharers)

    def worker_dir(self, slot: WorkerSlot) -> Path:
        return self.work_dir / slot.name.replace("/", "_")

    def _start(self, slot: WorkerSlot) -> None:
        config = self.worker_config(slot)
        env = {CONFIG_ENV: msgspec.json.encode(config).decode(), SETTINGS_ENV: self.settings.to_env()}
        # The worker's own credential (it admits that one worker only) and the CURVE keys go
        # through its secrets pipe: its environment is what its runners inherit.
        secrets = {}
        if self.join_secret is not None:
            secrets["credential"] = peer_credential(self.join_secret, "worker", slot.name, node=self.name)
        if self.keys is not None:
            secrets["curve"] = client_keys_to_text(self.keys)
        if slot.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            # CPU workers share the host's cores; one thread pool each would oversubscribe them.
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, self.cpu_workers)))
        slot.child = ChildProcess(slot.name, "specgen.runtime.worker", env=env, on_exit=self._child_exited,
                                  log_path=self.run_dir / "logs" / f"{slot.name.replace('/', '_')}.log",
                                  secrets=secrets)
        slot.state = "starting"
        slot.started_at = time.monotonic()
        slot.restart_at = None
        slot.child.start()
        log.info("started %s on %s (pid %s)", slot.name, slot.device, slot.child.pid)

    def _on_exit(self, child: ChildProcess, code: int) -> None:
        slot = self.slots.get(child.name)
        if slot is None or slot.child is not child or self.stopping:
            return
        tail = log_tail(child.log_path, 5)
        # The candidate it was judging, if any (the worker marks it in its work directory).
        judging = in_flight(self.worker_dir(slot), child.pid)
        head = f"exited with code {code}" + (f" while judging {judging}" if judging else "")
        slot.last_error = head + (f": {tail}" if tail else "")
        log.warning("%s %s", slot.name, head)
        reason = head + (f": {tail[-max(0, 498 - len(head)):]}" if tail else "")
        self.conn.send(WorkerExited(name=slot.name, exit_code=code, reason=reason[:500]))
        now = time.monotonic()
        if judging:
            # The candidate's doing, not the worker's: restarted without counting against
            # worker_max_restarts, or a stream of hostile candidates would make the node give up
            # on its workers. The candidate itself stops coming back: the scheduler fails a
            # request once it has lost max_request_attempts workers.
            slot.candidate_deaths += 1
            slot.state = "restarting"
            slot.restart_at = now + self.settings.worker_restart_backoff_s
            return
        while slot.restarts and now - slot.restarts[0] > _RESTART_WINDOW_S:
            slot.restarts.popleft()
        if len(slot.restarts) >= self.settings.worker_max_restarts:
            slot.state = "failed"
            log.error("%s died %d times in %d s (setting worker_max_restarts): not restarting it",
                      slot.name, len(slot.restarts), _RESTART_WINDOW_S)
            return
        slot.restarts.append(now)
        slot.state = "restarting"
        slot.restart_at = now + self.settings.worker_restart_backoff_s

    def request_stop(self, *_: object) -> None:
        self.inbox.put(_STOP)

    def run(self) -> None:
        self.notice_reader.start()
        self.conn.start()
        for slot in self.slots.values():
            self._start(slot)
        started = time.monotonic()
        next_warning = started + self.settings.connect_timeout_s
        while True:
            try:
                item = self.inbox.get(timeout=0.2)
            except queue.Empty:
                item = None
            if item is _STOP:
                break
            if item is not None:
                kind, *rest = item
                if kind == "exited":
                    self._on_exit(*rest)
                elif kind == "notice":
                    self._on_worker_notice(rest[0])
            now = time.monotonic()
            if next_warning is not None and now >= next_warning:
                # A node that never registers (scheduler down, wrong server key, refused key) keeps
                # trying; it says why every connect_timeout_s instead of waiting in silence.
                problem = self.conn.welcome_problem(now - started)
                if problem is None:
                    next_warning = None
                else:
                    log.warning("not registered with the scheduler yet: %s", problem)
                    next_warning = now + self.settings.connect_timeout_s
            for slot in self.slots.values():
                if slot.state == "restarting" and slot.restart_at is not None and now >= slot.restart_at:
                    self._start(slot)
                elif (slot.state == "starting" and slot.child is not None
                      and now - slot.started_at > self.settings.ready_timeout_s):
                    slot.last_error = (f"not ready within {self.settings.ready_timeout_s:g} s "
                                       "(setting ready_timeout_s)")
                    log.error("%s %s: killing it", slot.name, slot.last_error)
                    slot.state = "killing"
                    slot.child.signal(signal.SIGKILL)

    def _on_worker_notice(self, msg: object) -> None:
        if isinstance(msg, WorkerReady):
            slot = self.slots.get(msg.name)
            if slot is not None and slot.child is not None and slot.child.pid == msg.pid:
                slot.state = "ready"
                log.info("%s ready (%.1f s)", slot.name, time.monotonic() - slot.started_at)
        elif isinstance(msg, DeadNotice):
            slot = self.slots.get(msg.name)
            if slot is not None:
                slot.last_error = msg.reason
            log.error("%s reported a fatal error: %s", msg.name, msg.reason)

    def close(self) -> None:
        self.stopping = True
        children = [s.child for s in self.slots.values() if s.child is not None]
        threads = [threading.Thread(target=c.stop, args=(self.settings.shutdown_grace_s,)) for c in children]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for slot in self.slots.values():
            slot.state = "stopped"
        self.conn.close(Goodbye(reason="node stopping"))
        self.notice_reader.stop()
        self.ctx.term()
        shutil.rmtree(self.run_dir, ignore_errors=True)


def parse_devices(gpus: str | None, cpu_workers: int | None) -> list[str]:
    if gpus is not None and cpu_workers:
        raise UsageError("pass either --gpus or --cpu-workers, not both")
    if gpus is not None:
        try:
            ids = [int(g) for g in gpus.split(",") if g.strip()]
        except ValueError:
            raise UsageError(f"--gpus expects comma-separated GPU indices like 0,1; got {gpus!r}") from None
        if not ids:
            raise UsageError("--gpus lists no GPU")
        return [f"cuda:{i}" for i in ids]
    if cpu_workers is not None:
        if cpu_workers < 1:
            raise UsageError("--cpu-workers must be at least 1")
        return ["cpu"] * cpu_workers
    found = detect_gpus()
    return [f"cuda:{i}" for i in found] if found else ["cpu"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specgen-node", description=__doc__.splitlines()[0])
    p.add_argument("--scheduler", required=True, help="scheduler address, e.g. tcp://10.0.0.5:5555")
    p.add_argument("--gpus", help="GPU indices to serve, e.g. 0,1 (default: every GPU found)")
    p.add_argument("--cpu-workers", type=int, help="run N CPU workers (hosts without GPUs)")
    p.add_argument("--name", default=None, help="node name, unique per scheduler (default host-pid)")
    p.add_argument("--keys", type=Path, default=os.environ.get(KEYS_ENV) or None,
                   help="CURVE key directory (server.key, client.key_secret); required off loopback")
    p.add_argument("--join-secret", type=Path, default=None, metavar="FILE",
                   help="the cluster's join secret: the file `specgen serve --join-secret` names "
                        f"(default ${JOIN_SECRET_ENV}, else {DEFAULT_STATE_DIR / JOIN_SECRET_FILE} "
                        "when it exists: a scheduler with the default state directory on this host)")
    p.add_argument("--evaluator", default="eval",
                   help="'eval' (default), or 'replay[:RECORDING.json]' to play back recorded service times")
    p.add_argument("--work-dir", type=Path, default=None, help="scratch space for the workers")
    p.add_argument("--allow-unsandboxed", action="store_true",
                   help="run candidates even where this host cannot sandbox them (trusted code "
                        "only; every verdict then says sandbox 'none')")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override a runtime setting")
    return p


def find_join_secret(path: Path | None) -> bytes:
    """The join secret: from the parent (a LocalCluster's, through the secrets pipe), else the
    file `path`, $SPECGEN_JOIN_SECRET_FILE, or a local scheduler's default one."""
    given = take_secrets().get("join_secret")
    if given:
        return bytes.fromhex(given)
    path = path or (Path(os.environ[JOIN_SECRET_ENV]) if os.environ.get(JOIN_SECRET_ENV) else None)
    default = DEFAULT_STATE_DIR / JOIN_SECRET_FILE
    if path is None and default.exists():
        path = default
    if path is None:
        raise UsageError(f"no join secret: pass --join-secret FILE, the file `specgen serve` writes "
                         f"(STATE_DIR/{JOIN_SECRET_FILE}, mode 0600), or set ${JOIN_SECRET_ENV}")
    return load_join_secret(path)


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    take_secrets()
    # Nothing the workers start may learn where the secret is, or the CURVE keys.
    secret_file = os.environ.pop(JOIN_SECRET_ENV, None)
    client_keys_from_env(pop=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = build_parser().parse_args(argv)
    try:
        load_plugins()    # after the secrets left the environment: a plug-in's code never sees them
        from specgen.runtime.settings import settings_from_env

        settings = settings_from_env().with_overrides(args.set)
        if args.allow_unsandboxed:
            settings = msgspec.structs.replace(settings, eval_options=msgspec.structs.replace(
                settings.eval_options, sandbox="optional"))
        keys = load_client_keys(args.keys) if args.keys else None
        devices = parse_devices(args.gpus, args.cpu_workers)
        require_keys_for(args.scheduler, keys)
        join_secret = find_join_secret(args.join_secret or (Path(secret_file) if secret_file else None))
        name = args.name or f"{socket.gethostname()}-{os.getpid()}"
        node = NodeActor(args.scheduler, name, devices, settings, keys, args.evaluator, args.work_dir,
                         join_secret)
    except UsageError as exc:
        print(f"specgen-node: error: {exc}", file=sys.stderr)
        return 2
    on_signals(node.request_stop)
    print(f"specgen-node {name}: {len(devices)} worker(s) on {', '.join(devices)} -> {args.scheduler}", flush=True)
    try:
        node.run()
    except Exception as exc:
        log.exception("node failed")
        node.conn.send(DeadNotice(name=name, reason=f"{type(exc).__name__}: {exc}"))
        return 1
    finally:
        node.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
