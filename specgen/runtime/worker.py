"""The worker actor process: one evaluation service (one device), fed by the scheduler.

Started by `specgen-node` as `python -m specgen.runtime.worker` with a `WorkerConfig` in the
environment. The main thread waits for work by driving its scheduler connection (so an assignment
reaches it with no hand-over between threads), then runs the request on the evaluator (blocking);
meanwhile the connection's keeper thread keeps heartbeats flowing and turns CancelWork into a
cancel of the evaluator. Startup: the evaluator starts (spare candidate processes
are warmed), then WorkerReady goes to the node over a local PUSH socket; a fatal error sends a
DeadNotice to both the node and the scheduler before the process exits. A result is kept and
re-sent until the scheduler acknowledges it, so a scheduler restart loses no verdict; the Hello
lists the kept results' request ids, the only results of ours the scheduler takes besides the
current assignment's.

While it runs a request, the worker keeps `in-flight.json` in its work directory (its pid and the
request): a worker that dies with it there died judging that candidate, and its node does not
count such a death against the worker's restart budget (runtime/node.py). The evaluation runners,
which run the candidate's code, do not see the work directory.

The worker's credential (derived by its node from the join secret, runtime/auth.py) and CURVE
keys arrive through its secrets pipe (`process.take_secrets`) and are taken out of the environment
at start-up, before any evaluation runner exists: runners run untrusted candidate code and must
not be able to register as this worker.
"""
from __future__ import annotations

import collections
import logging
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Protocol

import msgspec
import zmq

from specgen.messages import (
    AssignWork, CancelWork, CandidateSubmission, CandidateUpdate, DeadNotice, Goodbye, Verdict,
    WorkDone, WorkerReady, _Wire,
)
from specgen.runtime import wire
from specgen.runtime.auth import (
    ClientKeys, client_keys_from_env, client_keys_from_text, present_credential,
)
from specgen.runtime.child_process import die_with_parent, on_signals, parent_alive, take_secrets
from specgen.runtime.plugins import load_plugins
from specgen.runtime.settings import RuntimeSettings, settings_from_env
from specgen.runtime.transport import PeerConnection

log = logging.getLogger("specgen.worker")

CONFIG_ENV = "SPECGEN_WORKER_CONFIG"
IN_FLIGHT = "in-flight.json"            # in the work directory while a request runs


def mark_in_flight(work_dir: Path, task: AssignWork | None) -> None:
    """Say (`task`) or unsay (None) in `work_dir` which request this process is running."""
    path = work_dir / IN_FLIGHT
    try:
        if task is None:
            path.unlink(missing_ok=True)
            return
        work_dir.mkdir(parents=True, exist_ok=True)
        sub = task.submission
        staging = path.with_suffix(".tmp")
        staging.write_bytes(msgspec.json.encode({
            "pid": os.getpid(), "request_id": task.request_id,
            "candidate": f"{sub.job_id}/{sub.candidate_id}", "stage": task.stage}))
        os.replace(staging, path)
    except OSError as exc:          # the node then counts a death as the worker's own
        log.warning("cannot write %s: %s", path, exc)


def in_flight(work_dir: Path, pid: int | None) -> str | None:
    """The request (as "job/candidate stage") the worker `pid` left marked in `work_dir`, or None
    when it was running none; the mark is removed."""
    path = work_dir / IN_FLIGHT
    try:
        mark = msgspec.json.decode(path.read_bytes())
        path.unlink(missing_ok=True)
    except (OSError, msgspec.DecodeError):
        return None
    if not isinstance(mark, dict) or pid is None or mark.get("pid") != pid:
        return None                 # a mark of an earlier process of that worker
    return f"{mark.get('candidate', '?')} {mark.get('stage', '?')}"


class WorkerConfig(msgspec.Struct, kw_only=True):
    name: str                               # e.g. "node-a/cpu0"
    node: str                               # the node that runs it
    device: str                             # "cpu" | "cuda:N"
    scheduler: str                          # scheduler address
    node_notices: str = ""                  # the node's PULL address for READY/DEAD ("" = none)
    work_dir: str                           # scratch space of the evaluation service
    evaluator: str = "eval"                 # "eval" | "replay" | "replay:RECORDING.json"
    gpu_sharers: int = 1                    # workers on this worker's GPU, itself included


class Evaluator(Protocol):
    def start(self) -> None: ...
    def run(self, submission: CandidateSubmission, stage: str = "full",
            run_id: str | None = None) -> Verdict: ...
    def cancel(self, run_id: str | None = None) -> None: ...
    def close(self) -> None: ...


def build_evaluator(config: WorkerConfig, settings: RuntimeSettings) -> Evaluator:
    if config.evaluator == "eval":
        from specgen.eval import EvalWorker

        options = settings.eval_options
        # Candidates must not see the cluster's sockets (ipc:// paths) beyond what the sandbox
        # always hides; its network namespace already cuts tcp:// addresses.
        hidden = [str(Path(a[len("ipc://"):]).parent) for a in (config.scheduler, config.node_notices)
                  if a.startswith("ipc://")]
        return EvalWorker(device=config.device, work_dir=Path(config.work_dir),
                          spare_processes=settings.spare_processes, options=options,
                          name=config.name, hidden_paths=hidden, gpu_sharers=config.gpu_sharers)
    if config.evaluator == "replay" or config.evaluator.startswith("replay:"):
        from specgen.runtime.replay_evaluator import ReplayEvaluator

        return ReplayEvaluator.from_spec(config.evaluator)
    raise ValueError(f"unknown evaluator {config.evaluator!r}: 'eval', 'replay' or 'replay:PATH'")


def run_assignment(evaluator: Evaluator, task: AssignWork, worker: str, *, skip: bool = False,
                   started: float | None = None) -> CandidateUpdate:
    """Run one assignment on `evaluator` (`skip`: it was cancelled before it started) and make
    the update that reports it, as `worker`."""
    sub = task.submission
    started = time.time() if started is None else started
    if skip:
        verdict = Verdict(stage=task.stage, error="cancelled before it started", code="cancelled")
    else:
        verdict = evaluator.run(sub, stage=task.stage, run_id=task.request_id)
    return CandidateUpdate(
        job_id=sub.job_id, candidate_id=sub.candidate_id, stage=task.stage, verdict=verdict,
        worker=worker, started_at=started, finished_at=time.time(), cancelled=verdict.code == "cancelled")


class WorkerActor:
    def __init__(self, config: WorkerConfig, settings: RuntimeSettings, keys: ClientKeys | None = None) -> None:
        self.config = config
        self.settings = settings
        self.host = socket.gethostname()    # pairs this worker with KV pools on its device
        self.evaluator: Evaluator | None = None
        self.tasks: collections.deque[AssignWork | None] = collections.deque()
        self.current: AssignWork | None = None
        self.cancelled: set[str] = set()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self.ctx = zmq.Context()
        self.conn = PeerConnection(
            config.scheduler, "worker", config.name, settings, keys,
            on_message=self._on_message, hello_fields=self._busy_fields,
            heartbeat_fields=self._heartbeat_fields, ctx=self.ctx)
        self.notices: zmq.Socket | None = None
        if config.node_notices:
            self.notices = self.ctx.socket(zmq.PUSH)
            self.notices.setsockopt(zmq.LINGER, 1000)
            self.notices.connect(config.node_notices)

    # -- whichever thread drives the connection ------------------------------------------
    def _busy_fields(self) -> dict[str, Any]:
        cur = self.current
        where: dict[str, Any] = {"node": self.config.node, "device": self.config.device, "host": self.host}
        status = getattr(self.evaluator, "sandbox_status", None)
        if status is not None:
            where["sandbox"] = status.kind if status.kind != "none" else f"none: {status.detail}"[:200]
        held = [m.request_id for m in self.conn.kept() if isinstance(m, WorkDone)]
        if held:
            where["held_results"] = held
        if cur is None:
            return where
        sub = cur.submission
        return {**where, "busy_request_id": cur.request_id, "busy_key": [sub.job_id, sub.candidate_id, cur.stage]}

    def _heartbeat_fields(self) -> dict[str, Any]:
        cur = self.current
        return {"busy_request_id": cur.request_id} if cur is not None else {}

    def _on_message(self, msg: _Wire) -> None:
        if isinstance(msg, AssignWork):
            self.tasks.append(msg)
        elif isinstance(msg, CancelWork):
            with self._lock:
                if self.current is not None and self.current.request_id == msg.request_id:
                    if self.evaluator is not None:
                        # By id: the main thread may not have entered evaluator.run() yet.
                        self.evaluator.cancel(msg.request_id)
                else:
                    self.cancelled.add(msg.request_id)

    # -- main thread ----------------------------------------------------------------------
    def notify_node(self, msg: _Wire) -> None:
        if self.notices is not None:
            try:
                self.notices.send_multipart(wire.encode(msg), flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def request_stop(self, *_: object) -> None:
        self.stopping.set()
        if self.evaluator is not None:
            self.evaluator.cancel()
        self.tasks.append(None)
        self.conn.wake()

    def run_one(self, task: AssignWork) -> CandidateUpdate:
        started = time.time()
        with self._lock:
            self.current = task
            skip = task.request_id in self.cancelled
            self.cancelled.discard(task.request_id)
        assert self.evaluator is not None
        work_dir = Path(self.config.work_dir)
        mark_in_flight(work_dir, task)
        update = run_assignment(self.evaluator, task, self.config.name, skip=skip, started=started)
        # Not on an exception: one raised out of the evaluation ends this process with the
        # candidate in flight, and the mark tells the node so.
        mark_in_flight(work_dir, None)
        return update

    def serve(self) -> None:
        self.evaluator = build_evaluator(self.config, self.settings)
        if self.stopping.is_set():
            return
        self.evaluator.start()
        self.notify_node(WorkerReady(name=self.config.name, pid=os.getpid()))
        self.conn.start()
        log.info("worker %s ready on %s", self.config.name, self.config.device)
        while not self.stopping.is_set():
            if not self.tasks:
                self.conn.drive(lambda: bool(self.tasks), 1.0)
                if not self.tasks:
                    if not parent_alive():
                        break
                    continue
            task = self.tasks.popleft()
            if task is None:
                break
            update = self.run_one(task)
            if self.stopping.is_set() and update.cancelled:
                break   # interrupted by our own shutdown: the Goodbye below re-queues it
            # Kept before it stops being current: a Hello in between lists it either way.
            self.conn.send_kept(WorkDone(request_id=task.request_id, update=update))
            with self._lock:
                self.current = None

    def close(self) -> None:
        cur = self.current
        self.conn.close(Goodbye(reason="worker stopping", busy_request_id=cur.request_id if cur else ""))
        try:
            if self.evaluator is not None:
                self.evaluator.close()
        finally:
            if self.notices is not None:
                self.notices.close()
            self.ctx.term()


def main() -> int:
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = msgspec.json.decode(os.environ[CONFIG_ENV], type=WorkerConfig)
    secrets = take_secrets()
    env_keys = client_keys_from_env(pop=True)   # never left in the environment the runners get
    keys = client_keys_from_text(secrets.get("curve")) or env_keys
    present_credential("worker", config.name, secrets.get("credential", ""))
    load_plugins()    # after the secrets left the environment: a plug-in's code never sees them
    settings = settings_from_env()
    actor = WorkerActor(config, settings, keys)
    on_signals(actor.request_stop)   # SIGTERM also comes when the node dies (PR_SET_PDEATHSIG)
    try:
        actor.serve()
    except Exception as exc:  # noqa: BLE001 - any fatal error becomes a DEAD notice
        reason = f"{type(exc).__name__}: {exc}"
        log.error("worker %s failed: %s\n%s", config.name, reason, traceback.format_exc())
        dead = DeadNotice(name=config.name, reason=reason)
        actor.notify_node(dead)
        if actor.conn.welcome is not None:   # registered: tell the scheduler too
            actor.conn.send(dead)
            time.sleep(0.3)   # let the keeper deliver it
        actor.close()
        return 1
    actor.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
