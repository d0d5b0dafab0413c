"""The optimize loop: iterations of reasoning, speculative forks, parallel evaluation, feedback.

One job runs as a handful of asyncio tasks: the iteration driver (which streams the reasoning and
hands each delta to the stream's `Forker`, which decides whether to fork), one task per fork in
flight, one task consuming evaluation updates, and a watchdog for the wall-time budget. Candidates
are submitted to the evaluation backend the moment they are extracted; every final verdict is
shown to the termination criterion.
When the job stops (target reached, a budget spent, iterations done, or an error) every generation
in flight is aborted at the engine and every evaluation still queued or running for the job is
cancelled at the backend before `run_job` returns.

Token budgets are enforced per delta: a job may overshoot by at most the tokens of one delta per
stream in flight.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from specgen.clock import SYSTEM_CLOCK, Clock, wait_for
from specgen.engines.base import Engine, EngineError, GenerationParams
from specgen.messages import (
    CandidateRecord,
    CandidateSubmission,
    CandidateUpdate,
    ForkRecord,
    IterationRecord,
    JobProgress,
    OptimizeEvent,
    OptimizeResult,
    OptimizeSpec,
    ReasoningRecord,
)
from specgen.optimize import prompts
from specgen.backend import BackendLoad, EvaluationBackend
from specgen.optimize.dedup import Deduplicator, fingerprint
from specgen.optimize.fork_prompt import ForkPromptBuilder
from specgen.optimize.forker import Forker, ForkTally, closing
from specgen.optimize.metrics import compute_metrics
from specgen.optimize.modes import Mechanisms, check_spec
from specgen.optimize.outputs import LoopJournal, ResumedRun
from specgen.optimize.termination import (
    JobStanding,
    TerminationCriterion,
    VerdictView,
    default_criterion,
)
from specgen.optimize.triggers import TriggerPolicy, build_trigger_policy
from specgen.runtime.ids import new_id
from specgen.traces.extraction import extract_candidate

log = logging.getLogger(__name__)
T = TypeVar("T")

EmitFn = Callable[[OptimizeEvent], None]
PolicyFactory = Callable[[], TriggerPolicy]

# Verdict statuses after which a candidate needs nothing more from the backend.
_FINAL = {"failed", "incorrect", "correct", "cancelled", "duplicate", "lost"}
_ORDINAL = re.compile(r"c(\d+)")   # the ordinal that starts a candidate id ("c007-<random>")


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


@dataclass
class _ReasoningOutcome:
    text: str
    ids: list[int]
    finish_reason: str | None
    answer_start: int | None          # offset of the think-end tag in `text`, when it came


@dataclass
class _IterationState:
    record: IterationRecord
    prompt_ids: list[int] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    stop_reason: str = ""
    forker: Forker | None = None          # the speculating stream's; None when none speculates
    candidate_ids: list[str] = field(default_factory=list)
    running: bool = True

    @property
    def forks(self) -> list[ForkRecord]:
        return self.forker.forks if self.forker is not None else []

    @property
    def fork_tasks(self) -> set[asyncio.Task]:
        return self.forker.tasks if self.forker is not None else set()


class OptimizeJob:
    """One job's state; `run_job` is the way in."""

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
        self.criterion = criterion or default_criterion(spec.target_speedup,
                                                        spec.improvement_margin)
        self.fork_prompts = ForkPromptBuilder(engine)
        self.dedup = Deduplicator()

        self.candidates: dict[str, CandidateRecord] = {}
        self.fork_tally = ForkTally()
        self.iterations: list[IterationRecord] = []
        self.reasoning: list[ReasoningRecord] = []
        self._iteration_states: list[_IterationState] = []
        self.best: CandidateRecord | None = None
        self.reasoning_tokens = 0
        self.workers_seen = 0
        self.no_candidate_notes: list[str] = []

        self.status: str | None = None
        self.stop_reason = ""
        self.error: str | None = None
        self.target_reason: str | None = None
        self.job_stop = asyncio.Event()
        self._verdicts = asyncio.Condition()
        self._active_requests: set[str] = set()
        self._submit_tasks: set[asyncio.Task] = set()
        self._candidate_count = 0
        self.started_at = 0.0
        self._t0: float | None = None
        self._first_iteration = 0
        self._carried: dict[str, CandidateRecord] = {}   # fingerprint -> found before a resume
        self._resubmit: list[CandidateRecord] = []
        if resume is not None:
            self._restore(resume)

    # ------------------------------------------------------------------------------ running

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    async def run(self) -> OptimizeResult:
        self.started_at = self.clock.wall()
        self._t0 = self.clock.now()
        self._emit("job_started", reason=f"mode {self.spec.mode}; speculation: "
                                         f"{self.mechanisms.describe()}")
        try:
            await self.engine.start()
        except EngineError as exc:
            self._fail(f"engine {self.engine.name} did not start: {exc}")
        consumer = asyncio.create_task(self._consume_updates(), name=f"{self.job_id}-updates")
        for record in self._resubmit:
            self._start_submit(record)
        watchdog = asyncio.create_task(self._watch_time(), name=f"{self.job_id}-watchdog")
        main = asyncio.create_task(self._iterate(), name=f"{self.job_id}-iterations")
        stop_wait = asyncio.create_task(self.job_stop.wait())
        try:
            await asyncio.wait({main, stop_wait, consumer}, return_when=asyncio.FIRST_COMPLETED)
            if consumer.done() and not main.done() and not self.job_stop.is_set():
                exc = consumer.exception() if not consumer.cancelled() else None
                self._fail(f"the evaluation backend's update stream ended: {exc!r}")
            if main.done() and not main.cancelled() and main.exception() is not None:
                exc = main.exception()
                if isinstance(exc, EngineError):
                    self._fail(f"engine {self.engine.name}: {exc}")
                else:
                    log.error("optimize job %s failed:\n%s", self.job_id,
                              "".join(traceback.format_exception(exc)))
                    self._fail(f"{type(exc).__name__}: {exc}")
        finally:
            await self._shutdown(main, consumer, watchdog, stop_wait)
        result = self._result()
        self._emit("job_finished", reason=f"{result.status}: {result.stop_reason}")
        return result

    async def _iterate(self) -> None:
        if self.target_reason is not None:       # a resumed run whose journal holds the target
            self._stop_job("target_reached", self.target_reason)
            return
        for index in range(self._first_iteration, self.spec.max_iterations):
            if self.job_stop.is_set():
                return
            state = self._begin_iteration(index)
            mode = self.spec.mode
            if mode == "best-of-n":
                await self._run_best_of_n(state)
            else:
                await self._run_single(state, speculate=(mode == "specgen"),
                                       wait_for_feedback=(mode != "pipeline"))
            self._end_iteration(state)
            if self.target_reason is not None:
                self._stop_job("target_reached", self.target_reason)
                return
        # Verdicts still owed for answers (pipeline's last ones) may hold the best kernel; so may
        # speculative candidates', but waiting for them holds the job's end behind their queue, so
        # they are cancelled with the job unless the spec asks to drain them.
        owed = list(self.candidates) if self.spec.drain_speculative else self._answer_ids(
            [c for c in self.candidates.values() if c.origin == "final"])
        await self._wait_for_verdicts(owed, self.job_stop)
        if self.target_reason is not None:
            self._stop_job("target_reached", self.target_reason)
        else:
            self._stop_job("iterations_done", f"{self.spec.max_iterations} iterations done")

    # ------------------------------------------------------------------------------ iterations

    def _begin_iteration(self, index: int) -> _IterationState:
        best = self.best.speedup if self.best is not None else None
        user = prompts.user_prompt(self.spec.problem_source, list(self.candidates.values()),
                                   self.best, notes=self.no_candidate_notes)
        messages = [{"role": "system", "content": prompts.SYSTEM_PROMPT},
                    {"role": "user", "content": user}]
        record = IterationRecord(index=index, started_at=self.clock.wall(),
                                 baseline_speedup=best if best is not None else 1.0, prompt=user)
        pin = getattr(self.engine, "pin_iteration", None)
        if pin is not None:
            # A replayed trace: every reasoning stream of this iteration replays its recording.
            pin(index)
        state = _IterationState(record=record, prompt_ids=self.engine.chat_prompt_ids(messages))
        record.prompt_tokens = len(state.prompt_ids)
        self.iterations.append(record)
        self._iteration_states.append(state)
        known = f"best so far {best:.3g}x" if best is not None else "no correct kernel yet"
        self._emit("iteration_started", iteration=index,
                   reason=f"{known}, {record.prompt_tokens} prompt tokens")
        return state

    def _end_iteration(self, state: _IterationState) -> None:
        state.running = False
        record = state.record
        record.finished_at = self.clock.wall()
        if not record.stop_reason:
            record.stop_reason = state.stop_reason or "reasoning finished"
        if not state.candidate_ids:
            self.no_candidate_notes.append(
                f"Iteration {record.index + 1} produced no complete ```python block defining "
                f"ModelNew (reasoning ended: {record.finish_reason or 'aborted'}).")
        if self.journal is not None:
            tally = self.fork_tally
            self.journal.iteration(
                record, [r for r in self.reasoning if r.iteration == record.index], state.forks,
                {"reasoning_tokens": self.reasoning_tokens, "fork_tokens": tally.fork_tokens,
                 "forks_skipped": tally.forks_skipped, "fork_count": tally.fork_count,
                 "workers_seen": self.workers_seen, "recent_fork_yields": tally.recent_fork_yields,
                 "no_candidate_notes": self.no_candidate_notes})
        self._emit("iteration_finished", iteration=record.index, reason=record.stop_reason)

    async def _run_single(self, state: _IterationState, *, speculate: bool,
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
            await self._wait_for_verdicts(self._answer_ids([final]), state.stop)

    async def _run_best_of_n(self, state: _IterationState) -> None:
        """n independent reasoning streams; each one's answer is evaluated when it ends."""
        async def one(sample: int) -> None:
            request_id = f"{self.job_id}/it{state.record.index}/reason{sample}"
            seed = None if self.spec.seed is None else self.spec.seed + sample
            outcome = await self._reason(state, request_id, speculate=False, seed=seed)
            self._submit_final(state, request_id, outcome)

        await self._until_stopped(
            state, asyncio.gather(*(one(i) for i in range(self.spec.best_of_n))))
        if not state.stop.is_set():
            await self._wait_for_verdicts(state.candidate_ids, state.stop)

    async def _until_stopped(self, state: _IterationState, awaitable: Awaitable[T]) -> T | None:
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

    async def _abort_iteration(self, state: _IterationState) -> None:
        """Abort the iteration's reasoning streams and forks at the engine."""
        requests = [r for r in self._active_requests if r.startswith(
            f"{self.job_id}/it{state.record.index}/")]
        await asyncio.gather(*(self.engine.abort(r) for r in requests), return_exceptions=True)
        if state.forker is not None:
            await state.forker.cancel()

    # ------------------------------------------------------------------------------ reasoning

    def _reasoning_params(self, seed: int | None) -> GenerationParams:
        return GenerationParams(max_tokens=self.spec.reasoning_max_tokens,
                                temperature=self.spec.temperature, top_p=self.spec.top_p,
                                seed=seed)

    async def _reason(self, state: _IterationState, request_id: str, speculate: bool,
                      seed: int | None) -> _ReasoningOutcome:
        forker = self._new_forker(state) if speculate else None
        think_end = self.engine.think_end
        ids: list[int] = []
        text = ""
        answer_start: int | None = None
        finish_reason: str | None = None
        record = state.record
        record.request_ids.append(request_id)
        stream_record = ReasoningRecord(request_id=request_id, iteration=record.index,
                                        started_at=self.clock.wall())
        self.reasoning.append(stream_record)
        self._active_requests.add(request_id)
        stream = self.engine.reason(request_id, state.prompt_ids, self._reasoning_params(seed))
        try:
            async with closing(stream):
                async for delta in stream:
                    previous_tokens, previous_len = len(ids), len(text)
                    ids.extend(delta.token_ids)
                    text += delta.text
                    stream_record.tokens += len(delta.token_ids)
                    record.reasoning_tokens += len(delta.token_ids)
                    self.reasoning_tokens += len(delta.token_ids)
                    if answer_start is None:
                        found = text.find(think_end, max(0, previous_len - len(think_end)))
                        if found >= 0:
                            answer_start = found
                            if forker is not None:
                                # The reasoning ends at the tag: what only its end completes (an
                                # unfenced program right before it, a fence this delta closes)
                                # is a draft now. The answer after the tag takes as long to write
                                # as the program it repeats; when it repeats the draft, it is
                                # judged by the draft's evaluation, started this much earlier.
                                forker.finish(request_id, text[:found], len(ids))
                        elif forker is not None:
                            forker.at_delta(request_id, ids, text, previous_len, previous_tokens)
                    self._check_token_budget()
                    if delta.finished:
                        finish_reason = delta.finish_reason
                        break
        except asyncio.CancelledError:
            stream_record.finish_reason = "abort"
            raise
        except EngineError:
            stream_record.finish_reason = "error"
            raise
        finally:
            self._active_requests.discard(request_id)
            stream_record.finished_at = self.clock.wall()
            stream_record.finish_reason = stream_record.finish_reason or finish_reason
        if finish_reason == "error":
            raise EngineError(f"reasoning stream {request_id} ended with an error")
        if forker is not None and answer_start is None:
            # No tag (a length cut, a stop string): the stream's end ends the reasoning. With a
            # tag, the reasoning's end was read where the tag came.
            forker.finish(request_id, text, len(ids))
        record.finish_reason = finish_reason
        record.reasoning_finished_at = self.clock.wall()
        self._emit("reasoning_finished", iteration=record.index, request_id=request_id,
                   position=len(ids), reason=finish_reason or "")
        return _ReasoningOutcome(text, ids, finish_reason, answer_start)

    def _submit_final(self, state: _IterationState, request_id: str,
                      outcome: _ReasoningOutcome) -> CandidateRecord | None:
        answer = outcome.text if outcome.answer_start is None else outcome.text[outcome.answer_start:]
        source = extract_candidate(answer)
        if source is None:
            return None
        return self._new_candidate(state, source, "final", request_id, len(outcome.ids))

    def _answer_ids(self, answers: list[CandidateRecord | None]) -> list[str]:
        """The candidates whose verdicts stand for these answers: an answer that repeats an earlier
        program (a fork or a draft wrote it first) is judged by that program's evaluation."""
        return [a.duplicate_of or a.candidate_id for a in answers if a is not None]

    def _load(self) -> BackendLoad:
        load = self.backend.load()
        self.workers_seen = max(self.workers_seen,
                                load.validation_workers + load.profiling_workers)
        return load

    # ------------------------------------------------------------------------------ forks

    def _new_forker(self, state: _IterationState) -> Forker:
        """The forker of the iteration's speculating stream. It shares the job's engine (whose
        prefix cache holds the reasoning), its fork tally and its requests in flight, which the
        job aborts when the iteration or the job stops."""
        state.forker = Forker(
            self.engine, self._policy_factory(), iteration=state.record.index,
            request_prefix=f"{self.job_id}/it{state.record.index}", prompt_ids=state.prompt_ids,
            on_candidate=functools.partial(self._new_candidate, state),
            fork_prompts=self.fork_prompts, fork_max_tokens=self.spec.fork_max_tokens,
            tally=self.fork_tally, emit=self._emit, clock=self.clock,
            stopped=lambda: state.stop.is_set() or self.job_stop.is_set(),
            on_tokens=self._check_token_budget, load_probe=self._load,
            requests=self._active_requests)
        return state.forker

    # ------------------------------------------------------------------------------ candidates

    def _new_candidate(self, state: _IterationState, source: str, origin: str,
                       request_id: str, position: int) -> CandidateRecord | None:
        if self.job_stop.is_set():
            return None
        if self._carried:
            carried = self._carried.pop(fingerprint(source), None)
            if carried is not None:
                return self._found_again(state, carried, request_id, position)
        # The ordinal reads in order; the random rest makes the id unguessable (runtime/ids.py).
        candidate_id = new_id(f"c{self._candidate_count:03d}")
        self._candidate_count += 1
        admission = self.dedup.admit(source, candidate_id)
        record = CandidateRecord(candidate_id=candidate_id, iteration=state.record.index,
                                 origin=origin, request_id=request_id, position=position,
                                 fingerprint=admission.fingerprint, source=source,
                                 extracted_at=self.clock.wall())
        state.candidate_ids.append(candidate_id)
        self.candidates[candidate_id] = record
        if admission.duplicate_of is not None:
            record.duplicate_of = admission.duplicate_of
            record.status = "duplicate"
        if self.journal is not None:
            # Before it is submitted: a candidate the backend has seen is always in the journal.
            self.journal.candidate(record)
        if record.status == "duplicate":
            self._emit("duplicate", iteration=record.iteration, request_id=request_id,
                       candidate_id=candidate_id, origin=origin, position=position,
                       reason=f"same program as {admission.duplicate_of}")
            return record
        self._start_submit(record)
        self._emit("candidate", iteration=record.iteration, request_id=request_id,
                   candidate_id=candidate_id, origin=origin, position=position)
        return record

    def _start_submit(self, record: CandidateRecord) -> None:
        submission = CandidateSubmission(
            job_id=self.job_id, candidate_id=record.candidate_id,
            problem_name=self.spec.problem_name, problem_source=self.spec.problem_source,
            candidate_source=record.source, origin=record.origin, iteration=record.iteration,
            extracted_at=record.extracted_at,
            deadline=(self.started_at + self.spec.time_budget_s
                      if self.spec.time_budget_s is not None else None),
        )
        task = asyncio.create_task(self._submit(record, submission),
                                   name=f"submit-{record.candidate_id}")
        self._submit_tasks.add(task)
        task.add_done_callback(self._submit_tasks.discard)

    def _found_again(self, state: _IterationState, record: CandidateRecord, request_id: str,
                     position: int) -> CandidateRecord:
        """The iteration a resume replays found a program its first run had found: the same
        candidate (its id, its verdicts or its evaluation still owed), not a new one."""
        state.candidate_ids.append(record.candidate_id)
        self._emit("candidate", iteration=state.record.index, request_id=request_id,
                   candidate_id=record.candidate_id, origin=record.origin, position=position,
                   reason="found again after a resume: evaluated once, under its first id")
        if record.status == "correct":
            self._judge(record)
        return record

    def _restore(self, run: ResumedRun) -> None:
        """Take over a killed run's journal. Completed iterations stand as they were (records,
        forks, tokens) and are not run again; the run goes on with the iteration that was in
        progress, from its start. Every candidate found before keeps its id and the verdicts
        that were journaled; one found again by the replayed iteration is that same candidate;
        one still owed a verdict is submitted again under its id (a scheduler whose journal has
        its verdicts answers from there)."""
        self.iterations = list(run.iterations)
        self.reasoning = list(run.reasoning)
        c = run.counters
        self.fork_tally = ForkTally(
            forks=list(run.forks), fork_count=int(c.get("fork_count", 0)),
            fork_tokens=int(c.get("fork_tokens", 0)),
            forks_skipped=int(c.get("forks_skipped", 0)),
            recent_fork_yields=[bool(y) for y in c.get("recent_fork_yields", [])])
        self.reasoning_tokens = int(c.get("reasoning_tokens", 0))
        self.workers_seen = int(c.get("workers_seen", 0))
        self.no_candidate_notes = [str(n) for n in c.get("no_candidate_notes", [])]
        self._first_iteration = len(run.iterations)
        for record in run.candidates.values():
            self.candidates[record.candidate_id] = record
            self.dedup.admit(record.source, record.candidate_id)
            ordinal = _ORDINAL.match(record.candidate_id)
            if ordinal is not None:
                self._candidate_count = max(self._candidate_count, int(ordinal.group(1)) + 1)
        for update in run.updates:
            record = self.candidates.get(update.candidate_id)
            if record is not None and record.status not in _FINAL:
                self._record_verdict(record, update)
        for record in self.candidates.values():
            if record.status == "correct" and record.speedup is not None and (
                    self.best is None or record.speedup > (self.best.speedup or 0.0)):
                self.best = record
            if record.duplicate_of is None and record.iteration >= self._first_iteration:
                self._carried.setdefault(record.fingerprint, record)
        self._resubmit = [r for r in self.candidates.values() if r.status == "pending"]
        target = self.spec.target_speedup
        if target is not None and self.best is not None and (self.best.speedup or 0.0) >= target:
            self.target_reason = (f"{self.best.candidate_id} reached {self.best.speedup:.3g}x "
                                  f"(target {target:.3g}x) before the resume")

    async def _submit(self, record: CandidateRecord, submission: CandidateSubmission) -> None:
        try:
            await self.backend.submit(submission)
        except Exception as exc:  # a refused submission costs that candidate, not the job
            log.warning("submitting %s failed: %s", record.candidate_id, exc)
            record.status = "lost"
            self._emit("error", candidate_id=record.candidate_id,
                       reason=f"submission failed: {exc}")
            await self._notify_verdicts()

    # ------------------------------------------------------------------------------ verdicts

    async def _consume_updates(self) -> None:
        async for update in self.backend.updates():
            if update.job_id != self.job_id:
                continue
            record = self.candidates.get(update.candidate_id)
            if record is None or record.status in _FINAL:
                continue
            if update.stage == "validate" and record.validation is not None:
                continue   # a backend answering a resubmitted candidate repeats what it said
            self._apply_update(record, update)
            await self._notify_verdicts()

    async def _notify_verdicts(self) -> None:
        async with self._verdicts:
            self._verdicts.notify_all()

    def _apply_update(self, record: CandidateRecord, update: CandidateUpdate) -> None:
        if self.journal is not None:
            self.journal.update(update)
        self._record_verdict(record, update)
        self._emit("update", iteration=record.iteration, candidate_id=record.candidate_id,
                   origin=record.origin, update=update)
        if record.status == "correct":
            self._judge(record)

    def _record_verdict(self, record: CandidateRecord, update: CandidateUpdate) -> None:
        verdict = update.verdict
        if update.cancelled:
            record.status = "cancelled"
        elif update.stage == "validate":
            record.validation = update
            if not verdict.correct:
                record.status = "failed" if (not verdict.compiled or verdict.flags) else "incorrect"
        else:  # "profile" or "full"
            if update.stage == "full" and verdict.speedup is None:
                record.validation = update
            else:
                record.profile = update
            if verdict.correct:
                record.status = "correct"
            else:
                record.status = "failed" if (not verdict.compiled or verdict.flags) else "incorrect"
        if record.status != "pending":
            record.feedback_at = self.clock.wall()

    def _judge(self, record: CandidateRecord) -> None:
        speedup = record.speedup
        if speedup is not None and (self.best is None or speedup > (self.best.speedup or 0.0)):
            self.best = record
        current = self._current_iteration()
        # The new verdict may also change the bar of candidates found after this one but judged
        # before it; ask again about every candidate the current iteration has not yet seen.
        for candidate in self._judgeable(current, record):
            termination = self.criterion.check(
                VerdictView(candidate.candidate_id, True, candidate.speedup),
                JobStanding(iteration=current.record.index if current else 0,
                            best_speedup=self.best.speedup if self.best else None,
                            bar=self._bar_before(candidate)))
            if termination is None:
                continue
            if termination.scope == "job":
                self.target_reason = self.target_reason or termination.reason
                if self.mechanisms.early_termination:
                    self._stop_job("target_reached", termination.reason)
                return
            if self.mechanisms.early_termination and current is not None and current.running \
                    and not current.stop.is_set():
                current.stop_reason = f"early termination: {termination.reason}"
                current.stop.set()
                self._emit("termination", iteration=current.record.index,
                           candidate_id=candidate.candidate_id, reason=current.stop_reason)
                return

    def _judgeable(self, current: _IterationState | None,
                   record: CandidateRecord) -> list[CandidateRecord]:
        """Correct candidates whose verdicts the current iteration's prompt did not include."""
        if current is None:
            return [record]
        began = current.record.started_at
        return [c for c in self.candidates.values() if c.status == "correct"
                and c.speedup is not None
                and (c.iteration == current.record.index or (c.feedback_at or 0.0) >= began)]

    def _bar_before(self, candidate: CandidateRecord) -> float:
        """Best correct speedup among candidates found before `candidate` (1.0 when none)."""
        best: float | None = None
        for other in self.candidates.values():     # in the order they were found
            if other is candidate:
                break
            if other.status == "correct" and other.speedup is not None:
                best = other.speedup if best is None else max(best, other.speedup)
        return 1.0 if best is None else best

    def _current_iteration(self) -> _IterationState | None:
        if self._iteration_states and self._iteration_states[-1].running:
            return self._iteration_states[-1]
        return None

    async def _wait_for_verdicts(self, candidate_ids: list[str], stop: asyncio.Event) -> None:
        def settled() -> bool:
            return stop.is_set() or self.job_stop.is_set() or all(
                self.candidates[c].status in _FINAL for c in candidate_ids)

        stop_watch = asyncio.create_task(self._notify_on(stop))
        try:
            async with self._verdicts:
                await wait_for(self.clock, self._verdicts.wait_for(settled),
                               self.spec.verdict_timeout_s)
        except asyncio.TimeoutError:
            lost = [c for c in candidate_ids if self.candidates[c].status not in _FINAL]
            for candidate_id in lost:
                self.candidates[candidate_id].status = "lost"
            self._emit("error", reason=f"no verdict for {', '.join(lost)} within "
                                       f"verdict_timeout_s={self.spec.verdict_timeout_s:g}s")
        finally:
            stop_watch.cancel()

    async def _notify_on(self, event: asyncio.Event) -> None:
        await event.wait()
        await self._notify_verdicts()

    # ------------------------------------------------------------------------------ budgets, stop

    def _check_token_budget(self) -> None:
        budget = self.spec.token_budget
        fork_tokens = self.fork_tally.fork_tokens
        if budget is not None and self.reasoning_tokens + fork_tokens >= budget:
            self._stop_job("token_budget", f"token budget of {budget} spent "
                                           f"({self.reasoning_tokens} reasoning + "
                                           f"{fork_tokens} fork tokens)")

    async def _watch_time(self) -> None:
        if self.spec.time_budget_s is None:
            return
        await self.clock.sleep(self.spec.time_budget_s)
        self._stop_job("time_budget", f"time budget of {self.spec.time_budget_s:g}s spent")

    def _stop_job(self, status: str, reason: str) -> None:
        if self.status is not None:
            return
        self.status, self.stop_reason = status, reason
        self.job_stop.set()
        for state in self._iteration_states:
            if state.running and not state.stop.is_set():
                state.stop_reason = f"job stopped: {reason}"
                state.stop.set()
        self._emit("termination", reason=f"{status}: {reason}")

    def cancel(self, reason: str = "cancelled by its owner") -> None:
        """Stop the job now, from any task of its event loop: generation is aborted and its
        evaluations cancelled before `run()` returns (status "cancelled")."""
        self._stop_job("cancelled", reason)

    def _fail(self, message: str) -> None:
        self.error = self.error or message
        self._stop_job("failed", message)

    async def _shutdown(self, main: asyncio.Task, consumer: asyncio.Task,
                        watchdog: asyncio.Task, stop_wait: asyncio.Task) -> None:
        if self.status is None:
            self._stop_job("cancelled", "the job was cancelled")
        # No generation may outlive the job: abort at the engine, then unwind the tasks.
        await asyncio.gather(*(self.engine.abort(r) for r in list(self._active_requests)),
                             return_exceptions=True)
        for task in (main, watchdog, stop_wait):
            task.cancel()
        forks = [t for s in self._iteration_states for t in s.fork_tasks]
        for task in forks:
            task.cancel()
        await asyncio.gather(main, watchdog, stop_wait, *forks, return_exceptions=True)
        # Submissions already sent must land before the cancel, or they would run after it.
        if self._submit_tasks:
            await asyncio.gather(*self._submit_tasks, return_exceptions=True)
        if any(r.status == "pending" for r in self.candidates.values()):
            try:
                await self.backend.cancel_job(self.job_id)
            except Exception as exc:
                log.warning("cancelling job %s at the backend failed: %s", self.job_id, exc)
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        for record in self.candidates.values():
            if record.status == "pending":
                record.status = "cancelled"
        for fork in self.fork_tally.forks:
            if fork.finished_at is None:
                fork.finished_at = self.clock.wall()
                fork.outcome, fork.finish_reason = "aborted", "abort"
        for state in self._iteration_states:
            if state.running:
                state.running = False
                state.record.finished_at = self.clock.wall()
                state.record.stop_reason = state.record.stop_reason or state.stop_reason

    # ------------------------------------------------------------------------------ results

    def _result(self) -> OptimizeResult:
        finished_at = self.clock.wall()
        candidates = list(self.candidates.values())
        best = self.best
        best_update = (best.profile or best.validation) if best is not None else None
        tally = self.fork_tally
        metrics = compute_metrics(
            started_at=self.started_at, finished_at=finished_at, candidates=candidates,
            forks=tally.forks, iterations=self.iterations, reasoning_tokens=self.reasoning_tokens,
            fork_tokens=tally.fork_tokens, forks_skipped=tally.forks_skipped,
            workers_hint=self.workers_seen, best=best)
        return OptimizeResult(
            job_id=self.job_id, problem_name=self.spec.problem_name, mode=self.spec.mode,
            status=self.status or "cancelled", stop_reason=self.stop_reason,
            engine=self.engine.name, started_at=self.started_at, finished_at=finished_at,
            best_candidate_id=best.candidate_id if best else None,
            best_speedup=best.speedup if best else None,
            best_source=best.source if best else None,
            best_verdict=best_update.verdict if best_update else None,
            cpu_timing=best_update.verdict.cpu_timing if best_update else True,
            spec=self.spec, iterations=self.iterations, reasoning=self.reasoning, forks=tally.forks,
            candidates=candidates, metrics=metrics, error=self.error)

    def progress(self) -> JobProgress:
        records = self.candidates.values()
        tally = self.fork_tally
        return JobProgress(
            elapsed_s=self.clock.now() - self._t0 if self._t0 is not None else 0.0,
            iteration=len(self.iterations),
            reasoning_tokens=self.reasoning_tokens,
            fork_tokens=tally.fork_tokens,
            forks=len(tally.forks),
            forks_running=sum(1 for f in tally.forks if f.finished_at is None),
            candidates=sum(1 for r in records if r.duplicate_of is None),
            validating=sum(1 for r in records if r.status == "pending" and r.validation is None),
            profiling=sum(1 for r in records if r.status == "pending" and r.validation is not None),
            profiled=sum(1 for r in records if r.profile is not None),
            best_speedup=self.best.speedup if self.best else None,
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

