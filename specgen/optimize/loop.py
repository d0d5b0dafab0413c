"""The optimize loop: iterations of reasoning, speculative forks, parallel evaluation, feedback.

One job runs as a handful of asyncio tasks: the iteration driver (which streams the reasoning and
hands each delta to the stream's `Forker`, which decides whether to fork), one task per fork in
flight, one task consuming evaluation updates, and a watchdog for the wall-time budget. Candidates
are submitted to the evaluation backend the moment they are extracted; every final verdict is
shown to the termination criterion.
When the job stops (target reached, a budget spent, iterations done, or an error) every generation
in flight is aborted at the engine and every evaluation still queued or running for the job is
cancelled at the backend before `run_job` returns.

`OptimizeJob` runs the modes' iterations and coordinates the parts that own the job's state, each
in its module: `Iterations` (records, prompts, which one runs), `ReasoningStreams` (the streams,
their tokens, the requests at the engine), the forks' `ForkTally`, `CandidateBook` (numbering,
duplicates, submission), `Verdicts` (the backend's updates, waits for them), `Referee` (the best
kernel, the criterion's answers) and `JobEnd` (why the job stopped, its budgets).

Token budgets are enforced per delta: a job may overshoot by at most the tokens of one delta per
stream in flight.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import traceback
from collections.abc import Awaitable, Callable
from typing import TypeVar

from specgen.backend import BackendLoad, EvaluationBackend
from specgen.clock import SYSTEM_CLOCK, Clock
from specgen.engines.base import Engine, EngineError
from specgen.messages import (
    CandidateOrigin, CandidateRecord, JobProgress, OptimizeEvent, OptimizeResult, OptimizeSpec,
    OptimizeStatus,
)
from specgen.optimize.candidates import CandidateBook, answer_ids
from specgen.optimize.fork_prompt import ForkPromptBuilder
from specgen.optimize.forker import Forker, ForkTally
from specgen.optimize.iterations import Iterations, IterationState
from specgen.optimize.job_end import JobEnd
from specgen.optimize.referee import Referee
from specgen.optimize.metrics import compute_metrics
from specgen.optimize.modes import Mechanisms, check_spec
from specgen.optimize.outputs import LoopJournal, ResumedRun
from specgen.optimize.reasoning import ReasoningOutcome, ReasoningStreams
from specgen.optimize.termination import TerminationCriterion, default_criterion
from specgen.optimize.triggers import TriggerPolicy, build_trigger_policy
from specgen.optimize.verdicts import Verdicts

log = logging.getLogger(__name__)
T = TypeVar("T")

EmitFn = Callable[[OptimizeEvent], None]
PolicyFactory = Callable[[], TriggerPolicy]


async def run_job(
    spec: OptimizeSpec,
    engine: Engine,
    backend: EvaluationBackend,
    emit: EmitFn | None = None,
    *,
    trigger_policy: PolicyFactory | None = None,
    criterion: TerminationCriterion | None = None,
    clock: Clock = SYSTEM_CLOCK,
    journal: LoopJournal | None = None,
    resume: ResumedRun | None = None,
) -> OptimizeResult:
    """Run one optimize job to its end and return the best correct kernel with the full history.

    `trigger_policy` (a factory: one fresh policy per reasoning stream) and `criterion` replace the
    ones the spec describes, for experiments with other policies. `clock` times the job: its
    timestamps, the wall-time budget and the wait for verdicts owed. `journal` records what the
    job learns as it goes; `resume` (read from such a journal) continues a run that was killed:
    see `OptimizeJob._restore` for what carries over.
    """
    job = OptimizeJob(spec, engine, backend, emit, trigger_policy=trigger_policy,
                      criterion=criterion, clock=clock, journal=journal, resume=resume)
    return await job.run()


class OptimizeJob:
    """One job: runs its iterations as its mode says, and coordinates the parts that hold its
    state; `run_job` is the way in."""

    def __init__(self, spec: OptimizeSpec, engine: Engine, backend: EvaluationBackend,
                 emit: EmitFn | None = None, *, trigger_policy: PolicyFactory | None = None,
                 criterion: TerminationCriterion | None = None,
                 clock: Clock = SYSTEM_CLOCK, journal: LoopJournal | None = None,
                 resume: ResumedRun | None = None) -> None:
        check_spec(spec)
        self.spec = spec
        self.clock = clock
        self.journal = journal
        self.engine = engine
        self.backend = backend
        self._emit_fn = emit
        self.mechanisms = Mechanisms.of(spec)
        self._policy_factory = trigger_policy or (lambda: build_trigger_policy(
            spec.triggers, forking=self.mechanisms.forking,
            inline_candidates=self.mechanisms.inline_candidates,
            load_aware=self.mechanisms.load_aware))
        self.fork_prompts = ForkPromptBuilder(engine)

        self.end = JobEnd(spec, clock, self._stopped)
        self.iterations = Iterations(spec, engine, clock, self._emit)
        self.streams = ReasoningStreams(spec, engine, clock, self._emit, self._check_token_budget)
        self.fork_tally = ForkTally()
        self.book = CandidateBook(spec, backend, clock, journal, self._emit,
                                  on_lost=lambda: self.verdicts.notify())
        self.verdicts = Verdicts(spec, backend, self.book, clock, journal, self._emit,
                                 self.end.event, on_correct=self._judge)
        self.referee = Referee(spec, criterion or default_criterion(spec.target_speedup,
                                                                spec.improvement_margin),
                           self.book, early_termination=self.mechanisms.early_termination)
        self.workers_seen = 0
        self.started_at = 0.0
        self._t0: float | None = None
        if resume is not None:
            self._restore(resume)

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def candidates(self) -> dict[str, CandidateRecord]:
        """Every candidate the job found, in the order it found them."""
        return self.book.records

    # ------------------------------------------------------------------------------ running

    async def run(self) -> OptimizeResult:
        self.started_at = self.clock.wall()
        self._t0 = self.clock.now()
        self._emit("job_started", reason=f"mode {self.spec.mode}; speculation: "
                                         f"{self.mechanisms.describe()}")
        try:
            await self.engine.start()
        except EngineError as exc:
            self.end.fail(f"engine {self.engine.name} did not start: {exc}")
        consumer = asyncio.create_task(self.verdicts.consume(), name=f"{self.job_id}-updates")
        self.book.start(self.started_at)
        watchdog = asyncio.create_task(self.end.watch_time(), name=f"{self.job_id}-watchdog")
        main = asyncio.create_task(self._iterate(), name=f"{self.job_id}-iterations")
        stop_wait = asyncio.create_task(self.end.event.wait())
        try:
            await asyncio.wait({main, stop_wait, consumer}, return_when=asyncio.FIRST_COMPLETED)
            if consumer.done() and not main.done() and not self.end.is_set():
                exc = consumer.exception() if not consumer.cancelled() else None
                self.end.fail(f"the evaluation backend's update stream ended: {exc!r}")
            if main.done() and not main.cancelled() and main.exception() is not None:
                exc = main.exception()
                if isinstance(exc, EngineError):
                    self.end.fail(f"engine {self.engine.name}: {exc}")
                else:
                    log.error("optimize job %s failed:\n%s", self.job_id,
                              "".join(traceback.format_exception(exc)))
                    self.end.fail(f"{type(exc).__name__}: {exc}")
        finally:
            await self._shutdown(main, consumer, watchdog, stop_wait)
        result = self._result()
        self._emit("job_finished", reason=f"{result.status}: {result.stop_reason}")
        return result

    async def _iterate(self) -> None:
        if self.referee.target_reason is not None:   # a resumed run whose journal holds the target
            self.end.stop("target_reached", self.referee.target_reason)
            return
        for index in range(self.iterations.first, self.spec.max_iterations):
            if self.end.is_set():
                return
            state = self.iterations.begin(index, list(self.candidates.values()), self.referee.best)
            mode = self.spec.mode
            if mode == "best-of-n":
                await self._run_best_of_n(state)
            else:
                await self._run_single(state, speculate=(mode == "specgen"),
                                       wait_for_feedback=(mode != "pipeline"))
            self._end_iteration(state)
            if self.referee.target_reason is not None:
                self.end.stop("target_reached", self.referee.target_reason)
                return
        # Verdicts still owed for answers (pipeline's last ones) may hold the best kernel; so may
        # speculative candidates', but waiting for them holds the job's end behind their queue, so
        # they are cancelled with the job unless the spec asks to drain them.
        owed = list(self.candidates) if self.spec.drain_speculative else answer_ids(
            [c for c in self.candidates.values() if c.origin == "final"])
        await self.verdicts.wait(owed, self.end.event)
        if self.referee.target_reason is not None:
            self.end.stop("target_reached", self.referee.target_reason)
        else:
            self.end.stop("iterations_done", f"{self.spec.max_iterations} iterations done")

    # ------------------------------------------------------------------------------ iterations

    def _end_iteration(self, state: IterationState) -> None:
        self.iterations.end(state)
        record = state.record
        if self.journal is not None:
            tally = self.fork_tally
            self.journal.iteration(
                record, self.streams.of_iteration(record.index), state.forks,
                {"reasoning_tokens": self.streams.tokens, "fork_tokens": tally.fork_tokens,
                 "forks_skipped": tally.forks_skipped, "fork_count": tally.fork_count,
                 "workers_seen": self.workers_seen, "recent_fork_yields": tally.recent_fork_yields,
                 "no_candidate_notes": self.iterations.no_candidate_notes})
        self._emit("iteration_finished", iteration=record.index, reason=record.stop_reason)

    async def _run_single(self, state: IterationState, *, speculate: bool,
                          wait_for_feedback: bool) -> None:
        """One reasoning stream; forks while it runs when `speculate`."""
        request_id = f"{self.job_id}/it{state.record.index}/reason"
        outcome = await self._until_stopped(
            state, self._reason(state, request_id, speculate, seed=self.spec.seed))
        if outcome is None:
            return
        final = self._submit_final(state, request_id, outcome)
        if not wait_for_feedback:
            state.stop_reason = "reasoning finished; next iteration without waiting for verdicts"
            return
        if state.fork_tasks:
            # A fork still writing was started from a prefix of the reasoning that has now written
            # its own answer: it can no longer give a candidate earlier than that answer.
            await self._abort_iteration(state)
        # The next prompt waits for the answer's verdict, as the sequential loop does; verdicts of
        # the speculative candidates still owed reach later prompts and the termination check as
        # they come, so speculation never makes an iteration wait for more than its answer.
        if not state.stop.is_set():
            await self.verdicts.wait(answer_ids([final]), state.stop)

    async def _run_best_of_n(self, state: IterationState) -> None:
        """n independent reasoning streams; each one's answer is evaluated when it ends."""
        async def one(sample: int) -> None:
            request_id = f"{self.job_id}/it{state.record.index}/reason{sample}"
            seed = None if self.spec.seed is None else self.spec.seed + sample
            outcome = await self._reason(state, request_id, speculate=False, seed=seed)
            self._submit_final(state, request_id, outcome)

        await self._until_stopped(
            state, asyncio.gather(*(one(i) for i in range(self.spec.best_of_n))))
        if not state.stop.is_set():
            await self.verdicts.wait(state.candidate_ids, state.stop)

    async def _until_stopped(self, state: IterationState, awaitable: Awaitable[T]) -> T | None:
        """Await `awaitable` unless the iteration is stopped first; then abort what it runs."""
        work = asyncio.ensure_future(awaitable)
        stopped = asyncio.create_task(state.stop.wait())
        try:
            await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if work.done():
            return work.result()
        state.record.stop_reason = state.stop_reason
        await self._abort_iteration(state)
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, EngineError):
            await work
        return None

    async def _abort_iteration(self, state: IterationState) -> None:
        """Abort the iteration's reasoning streams and forks at the engine."""
        await self.streams.abort(f"{self.job_id}/it{state.record.index}/")
        if state.forker is not None:
            await state.forker.cancel()

    # ------------------------------------------------------------------------------ reasoning, forks

    async def _reason(self, state: IterationState, request_id: str, speculate: bool,
                      seed: int | None) -> ReasoningOutcome:
        forker = self._new_forker(state) if speculate else None
        return await self.streams.run(state.record, state.prompt_ids, request_id, seed, forker)

    def _new_forker(self, state: IterationState) -> Forker:
        """The forker of the iteration's speculating stream. It shares the job's engine (whose
        prefix cache holds the reasoning), its fork tally and its requests in flight, which the
        job aborts when the iteration or the job stops."""
        state.forker = Forker(
            self.engine, self._policy_factory(), iteration=state.record.index,
            request_prefix=f"{self.job_id}/it{state.record.index}", prompt_ids=state.prompt_ids,
            on_candidate=functools.partial(self._new_candidate, state),
            fork_prompts=self.fork_prompts, fork_max_tokens=self.spec.fork_max_tokens,
            tally=self.fork_tally, emit=self._emit, clock=self.clock,
            stopped=lambda: state.stop.is_set() or self.end.is_set(),
            on_tokens=self._check_token_budget, load_probe=self._load,
            requests=self.streams.requests)
        return state.forker

    def _load(self) -> BackendLoad:
        load = self.backend.load()
        self.workers_seen = max(self.workers_seen,
                                load.validation_workers + load.profiling_workers)
        return load

    def _check_token_budget(self) -> None:
        self.end.check_tokens(self.streams.tokens, self.fork_tally.fork_tokens)

    # ------------------------------------------------------------------------------ candidates

    def _submit_final(self, state: IterationState, request_id: str,
                      outcome: ReasoningOutcome) -> CandidateRecord | None:
        source = outcome.answer_source()
        if source is None:
            return None
        return self._new_candidate(state, source, "final", request_id, len(outcome.ids))

    def _new_candidate(self, state: IterationState, source: str, origin: CandidateOrigin,
                       request_id: str, position: int) -> CandidateRecord | None:
        if self.end.is_set():
            return None
        carried = self.book.carried(source)
        if carried is not None:
            self.book.found_again(carried, state.record.index, request_id, position,
                                  state.candidate_ids)
            if carried.status == "correct":
                self._judge(carried)
            return carried
        return self.book.add(state.record.index, source, origin, request_id, position,
                             state.candidate_ids)

    def _judge(self, record: CandidateRecord) -> None:
        current = self.iterations.current()
        found = self.referee.judge(record, current)
        if found is None:
            return
        termination, candidate = found
        if termination.scope == "job":
            self.end.stop("target_reached", termination.reason)
        elif current is not None:
            current.halt(f"early termination: {termination.reason}")
            self._emit("termination", iteration=current.record.index,
                       candidate_id=candidate.candidate_id, reason=current.stop_reason)

    def _restore(self, run: ResumedRun) -> None:
        """Take over a killed run's journal. Completed iterations stand as they were (records,
        forks, tokens) and are not run again; the run goes on with the iteration that was in
        progress, from its start. Every candidate found before keeps its id and the verdicts
        that were journaled; one found again by the replayed iteration is that same candidate;
        one still owed a verdict is submitted again under its id (a scheduler whose journal has
        its verdicts answers from there)."""
        c = run.counters
        self.iterations.restore(run)
        self.streams.restore(run)
        self.fork_tally = ForkTally(
            forks=list(run.forks), fork_count=int(c.get("fork_count", 0)),
            fork_tokens=int(c.get("fork_tokens", 0)),
            forks_skipped=int(c.get("forks_skipped", 0)),
            recent_fork_yields=[bool(y) for y in c.get("recent_fork_yields", [])])
        self.workers_seen = int(c.get("workers_seen", 0))
        self.book.restore(run)
        self.verdicts.replay(run.updates)
        self.book.carry_over(self.iterations.first)
        self.referee.restore()

    # ------------------------------------------------------------------------------ stop

    def _stopped(self, status: OptimizeStatus, reason: str) -> None:
        """The job's end has come (`JobEnd` tells it once): its iterations stop with it."""
        self.iterations.stop_running(reason)
        self._emit("termination", reason=f"{status}: {reason}")

    def cancel(self, reason: str = "cancelled by its owner") -> None:
        """Stop the job now, from any task of its event loop: generation is aborted and its
        evaluations cancelled before `run()` returns (status "cancelled")."""
        self.end.stop("cancelled", reason)

    async def _shutdown(self, main: asyncio.Task, consumer: asyncio.Task,
                        watchdog: asyncio.Task, stop_wait: asyncio.Task) -> None:
        if self.end.status is None:
            self.end.stop("cancelled", "the job was cancelled")
        # No generation may outlive the job: abort at the engine, then unwind the tasks.
        await self.streams.abort()
        for task in (main, watchdog, stop_wait):
            task.cancel()
        forks = self.iterations.fork_tasks()
        for task in forks:
            task.cancel()
        await asyncio.gather(main, watchdog, stop_wait, *forks, return_exceptions=True)
        await self.book.close()
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        self.book.cancel_pending()
        for fork in self.fork_tally.forks:
            if fork.finished_at is None:
                fork.finished_at = self.clock.wall()
                fork.outcome, fork.finish_reason = "aborted", "abort"
        self.iterations.close()

    # ------------------------------------------------------------------------------ results

    def _result(self) -> OptimizeResult:
        finished_at = self.clock.wall()
        candidates = list(self.candidates.values())
        best = self.referee.best
        best_update = (best.profile or best.validation) if best is not None else None
        tally = self.fork_tally
        iterations, reasoning = self.iterations.records, self.streams.records
        metrics = compute_metrics(
            started_at=self.started_at, finished_at=finished_at, candidates=candidates,
            forks=tally.forks, iterations=iterations, reasoning_tokens=self.streams.tokens,
            fork_tokens=tally.fork_tokens, forks_skipped=tally.forks_skipped,
            workers_hint=self.workers_seen, best=best)
        return OptimizeResult(
            job_id=self.job_id, problem_name=self.spec.problem_name, mode=self.spec.mode,
            status=self.end.status or "cancelled", stop_reason=self.end.reason,
            engine=self.engine.name, started_at=self.started_at, finished_at=finished_at,
            best_candidate_id=best.candidate_id if best else None,
            best_speedup=best.speedup if best else None,
            best_source=best.source if best else None,
            best_verdict=best_update.verdict if best_update else None,
            cpu_timing=best_update.verdict.cpu_timing if best_update else True,
            spec=self.spec, iterations=iterations, reasoning=reasoning, forks=tally.forks,
            candidates=candidates, metrics=metrics, error=self.end.error)

    def progress(self) -> JobProgress:
        records = self.candidates.values()
        tally = self.fork_tally
        best = self.referee.best
        return JobProgress(
            elapsed_s=self.clock.now() - self._t0 if self._t0 is not None else 0.0,
            iteration=len(self.iterations.records),
            reasoning_tokens=self.streams.tokens,
            fork_tokens=tally.fork_tokens,
            forks=len(tally.forks),
            forks_running=sum(1 for f in tally.forks if f.finished_at is None),
            candidates=sum(1 for r in records if r.duplicate_of is None),
            validating=sum(1 for r in records if r.status == "pending" and r.validation is None),
            profiling=sum(1 for r in records if r.status == "pending" and r.validation is not None),
            profiled=sum(1 for r in records if r.profile is not None),
            best_speedup=best.speedup if best else None,
        )

    def _emit(self, kind: str, **fields: object) -> None:
        if self._emit_fn is None:
            return
        event = OptimizeEvent(job_id=self.job_id, kind=kind, t=self.clock.wall(),
                              progress=self.progress(), **fields)
        try:
            self._emit_fn(event)
        except Exception:  # a broken display must not stop the job
            log.exception("event callback failed on %s", kind)
