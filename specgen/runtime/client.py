"""The Python client of a specgen scheduler.

    from specgen import Client
    with Client("tcp://127.0.0.1:5555") as client:
        job = client.submit("problem.py", wall_time_s=600)
        for event in job.events():
            print(event.kind, event.data)
        print(job.result())
        verdict = client.evaluate(problem_src, candidate_src, stage="full")

The client is thread-safe; a thread waiting for a reply receives it itself, and events are
handled by whichever thread drives the connection (runtime/transport.py). After a scheduler
restart it registers again, re-sends unanswered requests, and re-subscribes its jobs from the last
event it saw, so an event stream neither skips nor repeats an event. A wait on a job (its events,
its result) gives up with SchedulerUnreachable once the scheduler said nothing for the setting
`scheduler_timeout_s` (the scheduler answers a heartbeat every `heartbeat_interval_s`), and ends at
once when the client is closed, with the error it was closed with.

A client acts for its own jobs only (runtime/ownership.py): those it created, or first submitted
candidates to. With CURVE they are its key's; without, they are its `client_token`'s, a random
secret made here unless given (pass `client.client_token` to a later Client to act for the same
jobs). `join_secret=` makes it the cluster's admin, who sees and acts for every job.
"""
from __future__ import annotations

import itertools
import os
import queue
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from specgen.errors import UsageError
from specgen.messages import (
    CancelJob, CandidateSubmission, CandidateUpdate, CandidateUpdateNotice, CreateJob,
    EvaluateQueued, EvaluateRequest, GetJob, GetStats, JobEvent, JobEventNotice, JobResult, JobSpec, JobStatus,
    Ping, ReportJobEvent, ReportJobResult, ResyncUpdates, SchedulerStats, SubscribeJob, Verdict,
    _Wire,
)
from specgen.runtime.auth import ClientKeys, admin_credential, load_client_keys, new_client_token, require_keys_for
from specgen.runtime.ids import new_job_id
from specgen.runtime.ownership import MIN_TOKEN_CHARS
from specgen.runtime.settings import RuntimeSettings
from specgen.runtime.transport import (AuthenticationFailed, PeerConnection, RemoteError,
                                       RuntimeFailure, SchedulerUnreachable)

UpdateSink = Callable[[CandidateUpdate], None]
ProgressSink = Callable[[EvaluateQueued], None]

# A wait on a job wakes this often to see whether the scheduler is still heard from.
_JOB_WAIT_SLICE_S = 0.25


class Job:
    """A job on the scheduler: its events, its result, and a way to cancel it."""

    def __init__(self, client: "Client", job_id: str) -> None:
        self.client = client
        self.job_id = job_id
        self.last_seq = 0
        self._events: queue.SimpleQueue[JobEvent] = queue.SimpleQueue()
        self._finished = threading.Event()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Job({self.job_id!r})"

    def _deliver(self, event: JobEvent) -> None:
        with self._lock:
            if event.seq <= self.last_seq:
                return   # replayed after a re-subscription: already seen
            self.last_seq = event.seq
        self._events.put(event)
        if event.kind == "finished":
            self._finished.set()

    def events(self, timeout: float | None = None) -> Iterator[JobEvent]:
        """Every event of the job in order, from the first, ending with its "finished" event.

        `timeout` bounds the wait for each next event (TimeoutError names the argument); a
        scheduler silent for the setting scheduler_timeout_s ends it (SchedulerUnreachable)."""
        while True:
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                try:
                    event = self._events.get(timeout=self._wait_slice(deadline))
                    break
                except queue.Empty:
                    pass
                self.client.check_connection()
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"job {self.job_id}: no event within {timeout:g} s (argument timeout)")
            yield event
            if event.kind == "finished":
                return

    def result(self, timeout: float | None = None) -> JobResult:
        """Wait for the job to end; `timeout` in seconds (TimeoutError names the argument); a
        scheduler silent for the setting scheduler_timeout_s ends the wait (SchedulerUnreachable)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._finished.wait(self._wait_slice(deadline)):
            self.client.check_connection()
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.job_id} did not finish within {timeout:g} s (argument timeout)")
        status = self.status()
        assert status.result is not None
        return status.result

    def done(self) -> bool:
        return self._finished.is_set()

    @staticmethod
    def _wait_slice(deadline: float | None) -> float:
        if deadline is None:
            return _JOB_WAIT_SLICE_S
        return max(0.0, min(_JOB_WAIT_SLICE_S, deadline - time.monotonic()))

    def status(self) -> JobStatus:
        return self.client._request(GetJob(call_id=0, job_id=self.job_id)).status  # type: ignore[attr-defined]

    def cancel(self) -> int:
        """Abort the job's reasoner and drop or stop its evaluations; returns requests dropped."""
        return self.client.cancel_job(self.job_id)


class Client:
    def __init__(
        self,
        address: str,
        *,
        keys: ClientKeys | Path | str | None = None,
        settings: RuntimeSettings | None = None,
        role: str = "client",
        name: str | None = None,
        connect_timeout_s: float | None = None,
        client_token: str | None = None,
        join_secret: bytes | None = None,
        connection: Callable[..., PeerConnection] = PeerConnection,
    ) -> None:
        """`client_token`: without CURVE, what this client's jobs belong to (default: a new
        random one; see `client_token`). `join_secret`: the cluster's, to register as its admin
        (AuthenticationFailed if the scheduler's is another). `connection` makes the connection to
        the scheduler, called as PeerConnection is (runtime/inprocess.py has one to a scheduler
        core in this process)."""
        if isinstance(keys, (str, Path)):
            keys = load_client_keys(Path(keys))
        require_keys_for(address, keys, "keys=")
        if client_token is not None and len(client_token) < MIN_TOKEN_CHARS:
            raise UsageError(f"client_token must have {MIN_TOKEN_CHARS} or more random characters "
                             f"(secrets.token_hex(16)), not {len(client_token)}")
        if join_secret is not None and role != "client":
            raise UsageError(f"join_secret= makes a client the admin; a {role} has credentials of its own")
        self.address = address
        self.settings = settings or RuntimeSettings()
        self._jobs: dict[str, Job] = {}
        self._sinks: list[tuple[UpdateSink, Callable[[], list[str]]]] = []
        self._lock = threading.Lock()
        # Ids of one-off evaluations: unique per client without a random draw per call.
        self._inline_prefix = f"inline-{secrets.token_hex(4)}-"
        self._inline_ids = itertools.count(1)
        # Kept for the connection's life, so a restarted scheduler still knows whose jobs are ours.
        self.client_token = client_token or new_client_token()
        name = name or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        hello = {"client_token": self.client_token} if role == "client" else {}
        self.conn = connection(
            address, role, name, self.settings, keys, on_message=self._on_message,
            on_reconnect=self._on_reconnect, hello_fields=lambda: hello,
            credential=admin_credential(join_secret, name) if join_secret is not None else None)
        self.conn.start()
        try:
            welcome = self.conn.wait_welcome(connect_timeout_s)
            if join_secret is not None and not welcome.admin:
                raise AuthenticationFailed(
                    f"the scheduler at {address} did not take this client's admin credential: the "
                    "join secret given is not that scheduler's (specgen serve --join-secret FILE, "
                    "default STATE_DIR/join_secret)")
        except Exception:
            self.conn.close()
            raise

    @property
    def admin(self) -> bool:
        """Whether the scheduler took this client for the cluster's admin."""
        welcome = self.conn.welcome
        return welcome is not None and welcome.admin

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, error: RuntimeFailure | None = None) -> None:
        """Close the connection (from any thread): requests and job waits under way fail with
        `error` (default: "connection closed")."""
        self.conn.close(error=error)

    def check_connection(self) -> None:
        """Raise what makes waiting on the scheduler pointless: the client was closed (the error it
        was closed with), or the scheduler said nothing for the setting scheduler_timeout_s."""
        if self.conn.closed:
            raise self.conn.close_error
        silent = time.monotonic() - self.conn.last_heard
        limit = self.settings.scheduler_timeout_s
        if silent > limit:
            raise SchedulerUnreachable(
                f"the scheduler at {self.address} has said nothing for {silent:.0f} s (setting "
                f"scheduler_timeout_s={limit:g}): it stopped, or cannot be reached from here")

    # -- whichever thread drives the connection ------------------------------------------
    def _on_message(self, msg: _Wire) -> None:
        if isinstance(msg, CandidateUpdateNotice):
            for sink, _ in list(self._sinks):
                sink(msg.update)
        elif isinstance(msg, JobEventNotice):
            job = self._jobs.get(msg.event.job_id)
            if job is not None:
                job._deliver(msg.event)

    def _on_reconnect(self) -> None:
        # A restarted scheduler: pick every stream up where it stopped. Sent without waiting
        # (this runs on the thread driving the connection, which must not wait on its own replies).
        for job in list(self._jobs.values()):
            if not job.done():
                self.conn.call(SubscribeJob(call_id=0, job_id=job.job_id, after_seq=job.last_seq))
        for _, job_ids in list(self._sinks):
            ids = job_ids()
            if ids:
                self.conn.call(ResyncUpdates(call_id=0, job_ids=ids))

    def add_update_sink(self, sink: UpdateSink, job_ids: Callable[[], list[str]]) -> None:
        """Receive every CandidateUpdate; `job_ids()` names the jobs to resync after a restart."""
        self._sinks.append((sink, job_ids))

    def remove_update_sink(self, sink: UpdateSink) -> None:
        self._sinks = [(s, j) for s, j in self._sinks if s is not sink]

    # -- requests -------------------------------------------------------------------------
    def _request(self, msg: _Wire, timeout: float | None = None,
                 on_progress: ProgressSink | None = None) -> _Wire:
        return self.conn.request(msg, timeout, on_progress)

    def ping(self, payload: bytes = b"") -> float:
        """Round trip to the scheduler in seconds."""
        start = time.perf_counter()
        self._request(Ping(call_id=0, payload=payload))
        return time.perf_counter() - start

    def stats(self) -> SchedulerStats:
        return self._request(GetStats(call_id=0)).stats  # type: ignore[attr-defined]

    def evaluate(
        self,
        problem_source: str,
        candidate_source: str,
        stage: str = "full",
        *,
        problem_name: str = "problem",
        timeout: float | None = None,
        on_progress: ProgressSink | None = None,
    ) -> Verdict:
        """Evaluate one candidate outside any job (blocking).

        A request that waits behind others is not a lost one: the scheduler acknowledges it when
        it is queued, with its queue position, and keeps reporting on it (EvaluateQueued: its
        position, or that a worker runs it) every quarter of `timeout` until the verdict comes.
        `timeout` (default: the setting call_timeout_s) is how long the scheduler may stay silent
        about the request; CallTimeout only once it did, never for a long queue. `on_progress`
        receives each report (e.g. to show the position), on the thread driving the connection:
        keep it quick."""
        if stage not in ("validate", "profile", "full"):
            raise UsageError(f"stage must be validate, profile or full, not {stage!r}")
        sub = CandidateSubmission(job_id="", candidate_id=f"{self._inline_prefix}{next(self._inline_ids)}",
                                  problem_name=problem_name,
                                  problem_source=problem_source, candidate_source=candidate_source,
                                  origin="inline", extracted_at=time.time())
        silence = self.settings.call_timeout_s if timeout is None else timeout
        request = EvaluateRequest(call_id=0, submission=sub, stage=stage, progress_interval_s=silence / 4)
        reply = self._request(request, timeout, on_progress)
        return reply.update.verdict  # type: ignore[attr-defined]

    def submit(
        self,
        problem: str | Path | JobSpec,
        *,
        entry: str = "",
        wall_time_s: float | None = None,
        max_tokens: int | None = None,
        max_iterations: int | None = None,
        options: dict[str, Any] | None = None,
        problem_name: str | None = None,
        job_id: str | None = None,
    ) -> Job:
        """Start a job on the scheduler. `problem` is a JobSpec, a path to a KernelBench-format
        program, or its source; `entry` ("module:function") runs the job's optimize loop in a
        reasoner process (default: the scheduler's setting default_job_entry)."""
        if isinstance(problem, JobSpec):
            spec = problem
        else:
            source, name = _read_problem(problem)
            spec = JobSpec(problem_name=problem_name or name, problem_source=source, entry=entry,
                           wall_time_s=wall_time_s, max_tokens=max_tokens,
                           max_iterations=max_iterations, options=dict(options or {}))
        # The id is made here so that re-sending CreateJob after a scheduler restart is idempotent.
        spec.job_id = spec.job_id or job_id or new_job_id()
        return self._follow(spec.job_id, CreateJob(call_id=0, spec=spec))

    def job(self, job_id: str) -> Job:
        """Follow an existing job of this client's (events from its first); RemoteError
        "not_owner" for another client's."""
        return self._follow(job_id)

    def _follow(self, job_id: str, create: CreateJob | None = None) -> Job:
        with self._lock:
            job = self._jobs.get(job_id)
            new = job is None
            if job is None:
                job = self._jobs[job_id] = Job(self, job_id)
        try:
            if create is not None:
                self._request(create)
            self._request(SubscribeJob(call_id=0, job_id=job_id, after_seq=job.last_seq))
        except RemoteError:
            if new:   # refused (e.g. another client's job): not one to re-subscribe after a restart
                with self._lock:
                    self._jobs.pop(job_id, None)
            raise
        return job

    def cancel_job(self, job_id: str) -> int:
        return self._request(CancelJob(call_id=0, job_id=job_id)).count  # type: ignore[attr-defined]

    def job_spec(self, job_id: str) -> JobSpec:
        return self._request(GetJob(call_id=0, job_id=job_id)).status.spec  # type: ignore[attr-defined]

    # -- for a job's reasoner ---------------------------------------------------------------
    def report_event(self, event: JobEvent) -> None:
        self.conn.send(ReportJobEvent(event=event))

    def report_result(self, result: JobResult) -> None:
        self._request(ReportJobResult(call_id=0, result=result))


def _read_problem(problem: str | Path) -> tuple[str, str]:
    if isinstance(problem, Path) or ("\n" not in problem and problem.endswith(".py")):
        path = Path(problem)
        if not path.is_file():
            raise UsageError(f"problem file {path} not found")
        return path.read_text(), path.stem
    if "class Model" not in problem:
        raise UsageError("problem must be a path to a KernelBench-format program or its source "
                         "(a `class Model(nn.Module)` with get_inputs() and get_init_inputs())")
    return problem, "problem"
