"""One process, one call: the scheduler's core, evaluation workers and jobs' loops, no sockets.

    async with InProcessCluster(["cpu"], state_dir=run / "state") as cluster:
        job = await asyncio.to_thread(cluster.client.submit, spec)     # a Client, as over ZeroMQ
        backend = cluster.backend()                                     # an EvaluationBackend

What decides is the same `SchedulerCore` that `specgen serve` runs (queues, validate-then-profile,
the pools' split, cancels, job deadlines, ownership, the journal): this module only carries its
messages. Each peer is what it is in a cluster, minus the socket:
- the client is a `Client` (runtime/client.py) over an `InProcessConnection`;
- a worker is a thread over the evaluator a worker process would build (runtime/worker.py), one per
  device; an evaluator that raises is a worker that died (its request runs on another);
- a job's reasoner is the reasoner's own code (runtime/reasoner.py), a task on the cluster's event
  loop (the loop running when the cluster was entered with `async with`; a thread of its own with
  `with`), its folder `state_dir/jobs/JOB`: a run resumed over the same `state_dir` continues
  from its journal, as a restarted scheduler does.

Every message goes through `deliver`: the core handles it under one lock, and what the core sends
back is routed by one thread at a time, in the order the core made it (a job's events must not
overtake each other). Routing never waits: a reply settles a future, a notice is handed to its
peer's callback, work is queued for its worker, a reasoner is started on the loop. Peers here are
threads of this process and cannot go silent without it, so heartbeats are not expected of them.
Blocking calls (`Client` requests) may come from any thread; a worker's evaluation runs on its own.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import logging
import queue
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

import msgspec

from specgen.messages import (
    AssignWork, CancelWork, DeadNotice, ErrorReply, EvaluateQueued, Hello, WorkDone, Welcome, _Wire,
)
from specgen.runtime.auth import new_join_secret, peer_credential, reasoner_credential
from specgen.runtime.client import Client
from specgen.runtime.journal import Journal
from specgen.runtime.private_files import make_private_dir
from specgen.runtime.scheduler_core import SchedulerCore
from specgen.runtime.settings import RuntimeSettings
from specgen.runtime.transport import RemoteError, RuntimeFailure
from specgen.runtime.worker import Evaluator, WorkerConfig, build_evaluator, run_assignment

log = logging.getLogger("specgen.inprocess")

_TICK_S = 0.05          # the core's timers (deadlines, retries), as often as the scheduler runs them
_NO_TIMEOUT_S = 1e12    # peers of one process: none goes silent without the whole process
ADDRESS = "inproc://specgen-inprocess"   # what its peers are told they talk to (no socket has it)


def _settle(fut: concurrent.futures.Future, value: Any = None, error: BaseException | None = None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


class InProcessConnection:
    """What a `Client` needs of its connection (runtime/transport.py's PeerConnection), to an
    `InProcessCluster`'s core: requests, their replies and progress, notices, close."""

    def __init__(self, cluster: "InProcessCluster", address: str, role: str, name: str,
                 settings: RuntimeSettings, keys: Any = None, on_message: Callable[[_Wire], None] | None = None,
                 hello_fields: Callable[[], dict[str, Any]] | None = None,
                 on_reconnect: Callable[[], None] | None = None, credential: str | None = None,
                 **_: Any) -> None:
        self.cluster = cluster
        self.address = address
        self.role, self.name, self.settings = role, name, settings
        self.identity = f"{role}/{name}/{secrets.token_hex(8)}".encode()
        self._on_message = on_message
        self._hello_fields = hello_fields or (lambda: {})
        self._credential = credential or ""
        self._ids = itertools.count(1)
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._progress: dict[int, Callable[[Any], None]] = {}
        self._lock = threading.Lock()
        self.welcome: Welcome | None = None
        self._welcomed = threading.Event()
        self._closed = False
        self.close_error = RuntimeFailure("connection closed")

    @property
    def last_heard(self) -> float:
        return time.monotonic()   # the core answers in the caller's own call: never silent

    @property
    def closed(self) -> bool:
        return self._closed or self.cluster.closed

    def start(self) -> "InProcessConnection":
        self.cluster.attach(self)
        self.cluster.deliver(self.identity, Hello(role=self.role, name=self.name, credential=self._credential,
                                                  **self._hello_fields()))
        return self

    def wait_welcome(self, timeout: float | None = None) -> Welcome:
        timeout = self.settings.connect_timeout_s if timeout is None else timeout
        if not self._welcomed.wait(timeout) or self.welcome is None:
            raise RuntimeFailure(f"the in-process scheduler did not welcome {self.role} {self.name}")
        return self.welcome

    def send(self, msg: _Wire) -> None:
        if not self.closed:
            self.cluster.deliver(self.identity, msg)

    def call(self, msg: _Wire, fut: concurrent.futures.Future | None = None,
             on_progress: Callable[[Any], None] | None = None) -> concurrent.futures.Future:
        fut = concurrent.futures.Future() if fut is None else fut
        if self.closed:
            fut.set_exception(self.close_error)
            return fut
        call_id = next(self._ids)
        msg.call_id = call_id  # type: ignore[attr-defined]
        with self._lock:
            self._pending[call_id] = fut
            if on_progress is not None:
                self._progress[call_id] = on_progress
        self.cluster.deliver(self.identity, msg)
        return fut

    def request(self, msg: _Wire, timeout: float | None = None,
                on_progress: Callable[[Any], None] | None = None) -> _Wire:
        if self.cluster.on_loop_thread():
            # Its reply may need the loop (a reasoner starting): wait from a thread of its own.
            raise RuntimeError("a blocking request to the in-process scheduler from its event loop's "
                               "thread; make it with asyncio.to_thread")
        fut = self.call(msg, on_progress=on_progress)
        try:
            return fut.result(self.settings.call_timeout_s if timeout is None else timeout)
        except concurrent.futures.TimeoutError:
            with self._lock:
                self._pending.pop(msg.call_id, None)  # type: ignore[attr-defined]
            raise RuntimeFailure(f"{type(msg).__name__} got no reply from the in-process scheduler "
                                 f"within {timeout or self.settings.call_timeout_s:g} s") from None
        finally:
            with self._lock:
                self._progress.pop(msg.call_id, None)  # type: ignore[attr-defined]

    def close(self, goodbye: _Wire | None = None, error: RuntimeFailure | None = None) -> None:
        if self._closed:
            return
        if goodbye is not None:
            self.send(goodbye)
        self._closed = True
        self.close_error = error or RuntimeFailure("connection closed")
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        for fut in pending:
            _settle(fut, error=self.close_error)
        self.cluster.detach(self)

    # -- routing (one thread at a time) ----------------------------------------------------
    def receive(self, msg: _Wire) -> None:
        if isinstance(msg, Welcome):
            self.welcome = msg
            self._welcomed.set()
            return
        if isinstance(msg, ErrorReply):
            with self._lock:
                fut = self._pending.pop(msg.ref, None) if msg.ref else None
            if fut is not None:
                _settle(fut, error=RemoteError(msg.code, msg.message))
            else:
                log.warning("%s %s: scheduler error: %s: %s", self.role, self.name, msg.code, msg.message)
            return
        call_id = getattr(msg, "call_id", 0)
        if type(msg) is EvaluateQueued:
            with self._lock:
                progress = self._progress.get(call_id)
            if progress is not None:
                progress(msg)
            return
        if call_id:
            with self._lock:
                fut = self._pending.pop(call_id, None)
            if fut is not None:
                _settle(fut, msg)
                return
        if self._on_message is not None:
            self._on_message(msg)


class _Worker:
    """A worker of the in-process cluster: one device's evaluator, on a thread of its own."""

    def __init__(self, cluster: "InProcessCluster", name: str, device: str, evaluator: Evaluator) -> None:
        self.cluster, self.name, self.device, self.evaluator = cluster, name, device, evaluator
        self.identity = f"worker/{name}".encode()
        self.tasks: queue.SimpleQueue[AssignWork | None] = queue.SimpleQueue()
        self.current: str | None = None        # request id it runs
        self.cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.restarts = 0
        self.thread = threading.Thread(target=self._serve, name=f"specgen-inprocess-{name}", daemon=True)

    def hello(self) -> Hello:
        status = getattr(self.evaluator, "sandbox_status", None)
        sandbox = "" if status is None else (status.kind if status.kind != "none" else f"none: {status.detail}"[:200])
        return Hello(role="worker", name=self.name, node="inprocess", device=self.device,
                     host=socket.gethostname(), sandbox=sandbox)

    def receive(self, msg: _Wire) -> None:
        if isinstance(msg, AssignWork):
            self.tasks.put(msg)
        elif isinstance(msg, CancelWork):
            with self._lock:
                if self.current == msg.request_id:
                    self.evaluator.cancel(msg.request_id)
                else:
                    self.cancelled.add(msg.request_id)
        elif isinstance(msg, ErrorReply):
            log.warning("worker %s: scheduler error: %s: %s", self.name, msg.code, msg.message)

    def _serve(self) -> None:
        while True:
            task = self.tasks.get()
            if task is None:
                return
            with self._lock:
                self.current = task.request_id
                skip = task.request_id in self.cancelled
                self.cancelled.discard(task.request_id)
            try:
                update = run_assignment(self.evaluator, task, self.name, skip=skip)
            except Exception as exc:  # noqa: BLE001 - a worker that failed: its request runs elsewhere
                log.exception("worker %s failed", self.name)
                reason = f"{type(exc).__name__}: {exc}"
                self.cluster.deliver(self.identity, DeadNotice(name=self.name, reason=reason))
                # As a node starts a dead worker again: it registers anew, at most
                # cluster_max_restarts times.
                self.restarts += 1
                if self.restarts > self.cluster.settings.cluster_max_restarts:
                    self.cluster.failure = f"worker {self.name} failed {self.restarts} times, last: {reason}"
                    return
                self.cluster.register(self)
                continue
            finally:
                with self._lock:
                    self.current = None
            self.cluster.deliver(self.identity, WorkDone(request_id=task.request_id, update=update,
                                                         call_id=next(self._ids)))

    def stop(self) -> None:
        self.evaluator.cancel()
        self.tasks.put(None)


class InProcessCluster:
    """A scheduler core with `devices`' workers and its jobs' reasoners in this process.

    `settings` as for `specgen serve` (`eval_options`, `spare_processes`, `pool_mode`, budgets...);
    `evaluators`, instead of `devices`: ready evaluators (started, kept by the caller), for tests
    and benchmarks that share one set between runs. `state_dir`: where the journal and the jobs'
    folders are kept (none: in memory, nothing to resume)."""

    where = "this process's scheduler"

    def __init__(self, devices: list[str] | None = None, *, settings: RuntimeSettings | None = None,
                 state_dir: Path | None = None, evaluators: list[Evaluator] | None = None,
                 evaluator: str = "eval") -> None:
        if not devices and not evaluators:
            raise ValueError("InProcessCluster needs devices or evaluators")
        base = settings or RuntimeSettings()
        self.settings = msgspec.structs.replace(base, peer_timeout_s=_NO_TIMEOUT_S)
        self.state_dir = make_private_dir(state_dir) if state_dir is not None else None
        self.devices = list(devices or [])
        self._given = evaluators
        self._evaluator_kind = evaluator
        self.failure: str | None = None         # what LocalCluster reports of a process that died
        self.kv_control_endpoint: str | None = None
        self.closed = False
        self._lock = threading.RLock()
        self._routing: collections.deque[tuple[bytes, _Wire]] = collections.deque()
        self._router: int | None = None         # the thread routing now
        self._peers: dict[bytes, Any] = {}      # identity -> connection or worker
        self._workers: list[_Worker] = []
        self._reasoners: dict[str, asyncio.Task] = {}
        self._stopping: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._stop_tick = threading.Event()
        self._tick_thread: threading.Thread | None = None
        self.core: SchedulerCore | None = None
        self._secret = new_join_secret()
        self.client: Client | None = None
        self._scratch: Any = None
        self._owned: list[Evaluator] = []       # evaluators built here, closed here

    # -- lifecycle ------------------------------------------------------------------------
    async def __aenter__(self) -> "InProcessCluster":
        self._loop = asyncio.get_running_loop()
        try:
            await asyncio.to_thread(self._start)
        except BaseException:
            await asyncio.to_thread(self._stop)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._cancel_reasoners()
        await asyncio.to_thread(self._stop)

    def __enter__(self) -> "InProcessCluster":
        ready = threading.Event()

        def run_loop() -> None:
            self._loop = asyncio.new_event_loop()
            ready.set()
            self._loop.run_forever()

        self._loop_thread = threading.Thread(target=run_loop, name="specgen-inprocess-loop", daemon=True)
        self._loop_thread.start()
        ready.wait()
        try:
            self._start()
        except BaseException:
            self._stop()
            self._stop_loop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._cancel_reasoners(), self._loop).result(60)
        self._stop()
        self._stop_loop()

    def _start(self) -> None:
        journal = Journal(self.state_dir / "journal.sqlite3" if self.state_dir is not None else ":memory:")
        evaluators = self._given if self._given is not None else self._build_evaluators()
        with self._lock:
            # A join secret held in memory, as LocalCluster's: the cluster's own client is its
            # admin (it follows every job, those of an earlier run over the same state too).
            self.core = SchedulerCore(self.settings, journal, join_secret=self._secret)
            # Jobs the journal holds from an earlier run start again with the first routing.
            self._collect()
        for i, evaluator in enumerate(evaluators):
            name = getattr(evaluator, "name", "") or f"inprocess/{i}"
            worker = _Worker(self, name, getattr(evaluator, "device", "cpu"), evaluator)
            self._workers.append(worker)
            self._peers[worker.identity] = worker
            worker.thread.start()
            self.register(worker)
        self.client = Client(ADDRESS, settings=self.settings, name="inprocess", join_secret=self._secret,
                             connection=self._connection)
        self._tick_thread = threading.Thread(target=self._tick, name="specgen-inprocess-tick", daemon=True)
        self._tick_thread.start()

    def _build_evaluators(self) -> list[Evaluator]:
        import tempfile

        self._scratch = tempfile.TemporaryDirectory(prefix="specgen-inprocess-")
        for i, device in enumerate(self.devices):
            config = WorkerConfig(name=f"inprocess/{device}#{i}", node="inprocess", device=device,
                                  scheduler="", work_dir=str(Path(self._scratch.name) / f"worker{i}"),
                                  evaluator=self._evaluator_kind)
            evaluator = build_evaluator(config, self.settings)
            self._owned.append(evaluator)     # closed by _stop, also when the next one fails
            evaluator.start()
        return list(self._owned)

    async def _cancel_reasoners(self) -> None:
        # Stopped, not ended: their jobs stay running in the journal and resume with it.
        self._stopping.update(self._reasoners)
        tasks = list(self._reasoners.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _stop(self) -> None:
        self._stop_tick.set()
        if self._tick_thread is not None:
            self._tick_thread.join(2.0)
        if self.client is not None:
            self.client.close()
        for worker in self._workers:
            worker.stop()
        for worker in self._workers:
            worker.thread.join(30.0)
        self.closed = True
        for evaluator in self._owned:
            evaluator.close()
        if self.core is not None:
            self.core.journal.close()
        if self._scratch is not None:
            self._scratch.cleanup()

    def _stop_loop(self) -> None:
        if self._loop_thread is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(10.0)
            self._loop.close()

    # -- peers ----------------------------------------------------------------------------
    def _connection(self, address: str, role: str, name: str, settings: RuntimeSettings,
                    keys: Any = None, **kwargs: Any) -> InProcessConnection:
        return InProcessConnection(self, address, role, name, settings, keys, **kwargs)

    def register(self, worker: _Worker) -> None:
        hello = worker.hello()
        hello.credential = peer_credential(self._secret, "worker", hello.name, hello.node)
        self.deliver(worker.identity, hello)

    def attach(self, peer: InProcessConnection) -> None:
        with self._lock:
            self._peers[peer.identity] = peer

    def detach(self, peer: InProcessConnection) -> None:
        with self._lock:
            self._peers.pop(peer.identity, None)

    def backend(self) -> Any:
        """An EvaluationBackend over this cluster, for an optimize loop driven by the caller."""
        from specgen.runtime.scheduler_backend import SchedulerEvaluationBackend

        assert self.client is not None, "enter the cluster first"
        return SchedulerEvaluationBackend(self.client)

    def on_loop_thread(self) -> bool:
        loop = self._loop
        if loop is None:
            return False
        try:
            return asyncio.get_running_loop() is loop
        except RuntimeError:
            return False

    # -- the core -------------------------------------------------------------------------
    def deliver(self, peer: bytes, msg: _Wire) -> None:
        """Hand `msg` from `peer` to the core, then route what it answers (any thread)."""
        with self._lock:
            if self.core is None:
                return
            now = self.core.clock.now()
            self.core.handle(peer, msg, now)
            self.core.schedule(now)
            self._collect()
        self._route()

    def _tick(self) -> None:
        while not self._stop_tick.wait(_TICK_S):
            with self._lock:
                assert self.core is not None
                now = self.core.clock.now()
                self.core.tick(now)
                self.core.schedule(now)
                self._collect()
            self._route()

    def _collect(self) -> None:
        """Under the lock: commit, then take the core's messages and actions in their order."""
        core = self.core
        assert core is not None
        core.journal.commit()
        self._routing.extend(core.outbox)
        core.outbox.clear()
        core.kv_outbox.clear()       # no KV pools report to an in-process cluster
        for action, job_id in core.actions:
            self._routing.append((b"", (action, job_id)))  # type: ignore[arg-type]
        core.actions.clear()

    def _route(self) -> None:
        me = threading.get_ident()
        while True:
            with self._lock:
                # Another thread routing takes these too, in order; so does this thread's own
                # routing further up its stack (a reply's callback that made a request).
                if self._router is not None or not self._routing:
                    return
                self._router = me
                peer, msg = self._routing.popleft()
            try:
                if peer == b"":
                    self._act(*msg)  # type: ignore[misc]
                else:
                    target = self._peers.get(peer)
                    if target is not None:
                        target.receive(msg)
            except Exception:  # noqa: BLE001 - one peer's fault must not stop the routing
                log.exception("in-process routing of %s to %r failed", type(msg).__name__, peer)
            finally:
                with self._lock:
                    self._router = None

    def _act(self, action: str, job_id: str) -> None:
        loop = self._loop
        assert loop is not None
        if action == "start_reasoner":
            loop.call_soon_threadsafe(self._start_reasoner, job_id)
        else:
            loop.call_soon_threadsafe(self._stop_reasoner, job_id)

    # -- reasoners (on the loop) -----------------------------------------------------------
    def _start_reasoner(self, job_id: str) -> None:
        old = self._reasoners.pop(job_id, None)
        if old is not None:
            self._stopping.add(job_id)
            old.cancel()
        self._reasoners[job_id] = asyncio.ensure_future(self._reasoner(job_id))

    def _stop_reasoner(self, job_id: str) -> None:
        task = self._reasoners.pop(job_id, None)
        if task is not None:
            self._stopping.add(job_id)
            task.cancel()

    async def _reasoner(self, job_id: str) -> None:
        from specgen.runtime.reasoner import serve_job

        run_dir = None
        if self.state_dir is not None:
            run_dir = make_private_dir(self.state_dir / "jobs" / job_id)
        with self._lock:
            assert self.core is not None
            credential = reasoner_credential(self._secret, job_id, self.core.reasoner_start(job_id) or 1)

        def connection(*args: Any, **kwargs: Any) -> InProcessConnection:
            return self._connection(*args, **{**kwargs, "credential": credential})

        task = asyncio.current_task()
        client = None
        try:
            client = await asyncio.to_thread(Client, ADDRESS, settings=self.settings, role="reasoner",
                                             name=job_id, connection=connection)
            await serve_job(client, job_id, run_dir, stopped=lambda: job_id in self._stopping)
        except Exception as exc:  # noqa: BLE001 - as a reasoner process that died: the core decides
            log.exception("job %s: reasoner failed", job_id)
            with self._lock:
                assert self.core is not None
                self.core.reasoner_exited(job_id, 1, f"{type(exc).__name__}: {exc}", self.core.clock.now())
                self._collect()
            self._route()
        finally:
            if client is not None:
                client.close()
            if self._reasoners.get(job_id) is task:
                del self._reasoners[job_id]
            self._stopping.discard(job_id)
