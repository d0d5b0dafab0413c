"""The forker: speculative forks of one reasoning stream.

At each reasoning delta the stream's trigger policy decides whether this is a point to fork; a fork
is a non-reasoning generation whose prompt is the stream's prompt ids + its reasoning ids so far +
the fork suffix (`fork_prompt.py`), sent to the engine that streams the reasoning, whose prefix
cache holds the reasoning's blocks. A fork's output, and a program the reasoning itself completes,
go to the job as candidate sources through one callback; the job numbers them, drops duplicates and
submits them, and the record it returns says whether a fork found something new. Evaluation reaches
the forker only as a load probe for the load-aware gate; the referee and iterations not at all.

A `Forker` serves one stream; what a job's forks add up to across its streams (request numbering,
tokens, vetoed points, recent yields, every fork's record) is a `ForkTally` the job journals and a
resume restores.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from specgen.backend import BackendLoad
from specgen.clock import SYSTEM_CLOCK, Clock
from specgen.engines.base import Engine, EngineError, GenerationParams, TokenDelta
from specgen.messages import CandidateOrigin, CandidateRecord, ForkRecord
from specgen.optimize.fork_prompt import FORK_STOP, ForkPromptBuilder
from specgen.optimize.triggers import TriggerContext, TriggerPolicy
from specgen.traces.extraction import extract_fork_candidate

# (source, origin, request_id, position) -> the job's record of it, or None when the job takes no
# more candidates; a record with `duplicate_of` set repeats an earlier program.
CandidateFn = Callable[[str, CandidateOrigin, str, int], "CandidateRecord | None"]
EmitFn = Callable[..., None]


@dataclass
class ForkTally:
    """A job's forks across all its streams."""

    forks: list[ForkRecord] = field(default_factory=list)
    fork_count: int = 0                   # numbers fork requests; never reused within a job
    fork_tokens: int = 0
    forks_skipped: int = 0                # trigger points a gate vetoed
    recent_fork_yields: list[bool] = field(default_factory=list)  # finished forks: new candidate?


class Forker:
    """Forks of one reasoning stream; the stream calls `at_delta` after each delta before its
    think-end tag and `finish` when it ends without one."""

    def __init__(self, engine: Engine, policy: TriggerPolicy, *, iteration: int,
                 request_prefix: str, prompt_ids: list[int], on_candidate: CandidateFn,
                 fork_prompts: ForkPromptBuilder | None = None, fork_max_tokens: int = 4096,
                 tally: ForkTally | None = None, emit: EmitFn | None = None,
                 clock: Clock = SYSTEM_CLOCK, stopped: Callable[[], bool] = lambda: False,
                 on_tokens: Callable[[], None] = lambda: None,
                 load_probe: Callable[[], BackendLoad] | None = None,
                 requests: set[str] | None = None) -> None:
        self.engine = engine
        self.policy = policy
        self.iteration = iteration
        self.request_prefix = request_prefix
        self.prompt_ids = prompt_ids
        self.on_candidate = on_candidate
        self.fork_prompts = fork_prompts or ForkPromptBuilder(engine)
        self.fork_max_tokens = fork_max_tokens
        self.tally = tally if tally is not None else ForkTally()
        self._emit = emit or (lambda kind, **fields: None)
        self.clock = clock
        self._stopped = stopped
        self._on_tokens = on_tokens
        self._load_probe = load_probe
        # Shared with the job, which aborts every request in it when the job or iteration stops.
        self.requests = requests if requests is not None else set()
        self.last_fork_position = 0
        self.forks: list[ForkRecord] = []
        self.tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------------------------ trigger points

    def at_delta(self, request_id: str, ids: list[int], text: str, previous_len: int,
                 previous_tokens: int) -> None:
        position = len(ids)
        ctx = TriggerContext(
            iteration=self.iteration,
            reasoning_tokens=position,
            text=text,
            new_text_start=previous_len,
            previous_tokens=previous_tokens,
            tokens_since_last_fork=position - self.last_fork_position,
            forks_this_iteration=len(self.forks),
            forks_in_flight=sum(1 for f in self.forks if f.finished_at is None),
            recent_fork_yields=self.tally.recent_fork_yields,
            load_probe=self._load_probe,
        )
        decision = self.policy.decide(ctx)
        if decision is None:
            return
        for source in decision.inline_candidates:
            self.on_candidate(source, "inline", request_id, position)
            # The reasoning just wrote a whole program: a fork here would only copy it, so the
            # gap to the next fork counts from this point, as if a fork had been taken.
            self.last_fork_position = position
        if decision.skipped_by is not None:
            self.tally.forks_skipped += 1
            self._emit("fork_skipped", iteration=self.iteration, position=position,
                       reason=f"{decision.firing.trigger} ({decision.firing.reason}) vetoed by "
                              f"{decision.skipped_by}")
        elif decision.fork and not decision.inline_candidates and not self._stopped():
            self.start_fork(ids[:], position,
                            f"{decision.firing.trigger}: {decision.firing.reason}")

    def finish(self, request_id: str, text: str, position: int) -> None:
        """The stream ended without its think-end tag: a program its last line closed counts."""
        for source in self.policy.finish(text):
            self.on_candidate(source, "inline", request_id, position)

    # ------------------------------------------------------------------------------ forks

    def start_fork(self, reasoning_ids: list[int], position: int, trigger: str) -> None:
        request_id = f"{self.request_prefix}/fork{self.tally.fork_count}"
        self.tally.fork_count += 1
        fork = ForkRecord(request_id=request_id, iteration=self.iteration, position=position,
                          trigger=trigger, started_at=self.clock.wall())
        self.forks.append(fork)
        self.last_fork_position = position
        self.tally.forks.append(fork)
        task = asyncio.create_task(self._fork(fork, reasoning_ids), name=request_id)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        self._emit("fork_started", iteration=self.iteration, request_id=request_id,
                   position=position, reason=trigger)

    async def cancel(self) -> None:
        """Cancel the forks in flight and wait for them to record it. Their engine requests are
        the caller's to abort (in `requests`), together with the reasoning's."""
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _fork(self, fork: ForkRecord, reasoning_ids: list[int]) -> None:
        params = GenerationParams(max_tokens=self.fork_max_tokens, temperature=0.0,
                                  stop=list(FORK_STOP))
        opened = self.fork_prompts.opens_fence
        text = ""
        self.requests.add(fork.request_id)
        stream = self.engine.fork(fork.request_id, self.prompt_ids, reasoning_ids,
                                  self.fork_prompts.suffix_ids(), params)
        try:
            async with closing(stream):
                async for delta in stream:
                    if fork.prompt_tokens is None and delta.num_prompt_tokens is not None:
                        fork.prompt_tokens = delta.num_prompt_tokens
                    if fork.cached_tokens is None and delta.num_cached_tokens is not None:
                        fork.cached_tokens = delta.num_cached_tokens
                    fork.tokens += len(delta.token_ids)
                    self.tally.fork_tokens += len(delta.token_ids)
                    text += delta.text
                    self._on_tokens()
                    if delta.finished:
                        fork.finish_reason = delta.finish_reason
                        break
                    if opened and "\n```" in text[-(len(delta.text) + 4):]:
                        # The program is complete; whatever the engine would write after the
                        # fence is not needed.
                        fork.finish_reason = "stop"
                        await self.engine.abort(fork.request_id)
                        break
        except asyncio.CancelledError:
            fork.outcome, fork.finish_reason = "aborted", "abort"
            fork.finished_at = self.clock.wall()
            self._fork_done(fork, produced=False)
            raise
        except EngineError as exc:
            fork.outcome, fork.finish_reason = "error", "error"
            fork.finished_at = self.clock.wall()
            self._fork_done(fork, produced=False, note=str(exc))
            return
        finally:
            self.requests.discard(fork.request_id)
        fork.finished_at = self.clock.wall()
        if fork.finish_reason == "abort":
            fork.outcome = "aborted"
            self._fork_done(fork, produced=False)
            return
        source = extract_fork_candidate(text, opened_fence=opened)
        record = None
        if source is not None:
            record = self.on_candidate(source, "fork", fork.request_id, fork.position)
        if record is None:
            fork.outcome = "no_code"
        else:
            fork.candidate_id = record.candidate_id
            fork.outcome = "duplicate" if record.duplicate_of is not None else "candidate"
        self._fork_done(fork, produced=fork.outcome == "candidate")

    def _fork_done(self, fork: ForkRecord, *, produced: bool, note: str = "") -> None:
        if fork.outcome != "aborted":
            self.tally.recent_fork_yields.append(produced)
        self._emit("fork_finished", iteration=fork.iteration, request_id=fork.request_id,
                   candidate_id=fork.candidate_id, position=fork.position,
                   reason=fork.outcome + (f": {note}" if note else ""))


@contextlib.asynccontextmanager
async def closing(stream: AsyncIterator[TokenDelta]):
    """Close an engine stream however the loop over it ends (break, abort, cancellation)."""
    try:
        yield stream
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
