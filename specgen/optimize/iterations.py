"""A job's iterations: each one's record, prompt and stop while it runs, and the notes that carry an
iteration without a program into the next prompt.

`Iterations` begins an iteration (its prompt from the feedback so far, its record), ends it, and
says which one is running: the one a verdict's early termination may stop. An `IterationState` is
one iteration while it runs: its prompt ids, its stop event and why it was set, the forker of its
speculating stream and the candidates it found. Completed iterations restored from a journal stand
as records only; they have no state, since they do not run again.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from specgen.clock import Clock
from specgen.engines.base import Engine
from specgen.messages import CandidateRecord, ForkRecord, IterationRecord, OptimizeSpec
from specgen.optimize import prompts
from specgen.optimize.forker import Forker
from specgen.optimize.outputs import ResumedRun

EmitFn = Callable[..., None]


@dataclass
class IterationState:
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

    def halt(self, reason: str) -> None:
        self.stop_reason = reason
        self.stop.set()


class Iterations:
    """The job's iterations in order; `records` holds the completed ones a resume restored too."""

    def __init__(self, spec: OptimizeSpec, engine: Engine, clock: Clock, emit: EmitFn) -> None:
        self.spec = spec
        self.engine = engine
        self.clock = clock
        self._emit = emit
        self.records: list[IterationRecord] = []
        self.states: list[IterationState] = []
        self.no_candidate_notes: list[str] = []
        self.first = 0                        # the first one to run (after those a journal holds)

    def restore(self, run: ResumedRun) -> None:
        self.records = list(run.iterations)
        self.no_candidate_notes = [str(n) for n in run.counters.get("no_candidate_notes", [])]
        self.first = len(run.iterations)

    def begin(self, index: int, candidates: list[CandidateRecord],
              best: CandidateRecord | None) -> IterationState:
        best_speedup = best.speedup if best is not None else None
        user = prompts.user_prompt(self.spec.problem_source, candidates, best,
                                   notes=self.no_candidate_notes)
        messages = [{"role": "system", "content": prompts.SYSTEM_PROMPT},
                    {"role": "user", "content": user}]
        record = IterationRecord(index=index, started_at=self.clock.wall(),
                                 baseline_speedup=best_speedup if best_speedup is not None else 1.0,
                                 prompt=user)
        pin = getattr(self.engine, "pin_iteration", None)
        if pin is not None:
            # A replayed trace: every reasoning stream of this iteration replays its recording.
            pin(index)
        state = IterationState(record=record, prompt_ids=self.engine.chat_prompt_ids(messages))
        record.prompt_tokens = len(state.prompt_ids)
        self.records.append(record)
        self.states.append(state)
        known = (f"best so far {best_speedup:.3g}x" if best_speedup is not None
                 else "no correct kernel yet")
        self._emit("iteration_started", iteration=index,
                   reason=f"{known}, {record.prompt_tokens} prompt tokens")
        return state

    def end(self, state: IterationState) -> None:
        state.running = False
        record = state.record
        record.finished_at = self.clock.wall()
        if not record.stop_reason:
            record.stop_reason = state.stop_reason or "reasoning finished"
        if not state.candidate_ids:
            self.no_candidate_notes.append(
                f"Iteration {record.index + 1} produced no complete ```python block defining "
                f"ModelNew (reasoning ended: {record.finish_reason or 'aborted'}).")

    def current(self) -> IterationState | None:
        if self.states and self.states[-1].running:
            return self.states[-1]
        return None

    def stop_running(self, reason: str) -> None:
        """The job stopped: so does every iteration still running."""
        for state in self.states:
            if state.running and not state.stop.is_set():
                state.halt(f"job stopped: {reason}")

    def fork_tasks(self) -> list[asyncio.Task]:
        return [t for s in self.states for t in s.fork_tasks]

    def close(self) -> None:
        """At the job's end: an iteration still running ends where the job did."""
        for state in self.states:
            if state.running:
                state.running = False
                state.record.finished_at = self.clock.wall()
                state.record.stop_reason = state.record.stop_reason or state.stop_reason
