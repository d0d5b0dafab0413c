"""A job's reasoning streams, and every request it has in flight at the engine.

`ReasoningStreams.run` streams one reasoning generation to its end. It counts the stream's tokens
(in the stream's record, its iteration's and the job's), finds the think-end tag that closes the
reasoning, hands each delta before the tag to the stream's forker, and asks the job's token budget
after each delta. The reasoning's requests and the forkers' (a forker adds its forks to the same
set) are held in `requests`, so that an iteration, or the job, aborts all of its own at once.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from specgen.clock import Clock
from specgen.engines.base import Engine, EngineError, GenerationParams
from specgen.messages import IterationRecord, OptimizeSpec, ReasoningRecord
from specgen.traces.extraction import extract_candidate
from specgen.optimize.forker import Forker, closing
from specgen.optimize.outputs import ResumedRun

EmitFn = Callable[..., None]


@dataclass
class ReasoningOutcome:
    text: str
    ids: list[int]
    finish_reason: str | None
    answer_start: int | None          # offset of the think-end tag in `text`, when it came

    def answer_source(self) -> str | None:
        """The program of the answer (the text after the tag, or all of it without one)."""
        return extract_candidate(self.text if self.answer_start is None
                                 else self.text[self.answer_start:])


class ReasoningStreams:
    """The job's reasoning streams: their records, the tokens they wrote, the requests in flight."""

    def __init__(self, spec: OptimizeSpec, engine: Engine, clock: Clock, emit: EmitFn,
                 on_tokens: Callable[[], None]) -> None:
        self.spec = spec
        self.engine = engine
        self.clock = clock
        self._emit = emit
        self._on_tokens = on_tokens
        self.records: list[ReasoningRecord] = []
        self.tokens = 0                       # every stream's, all iterations
        self.requests: set[str] = set()       # reasoning and fork requests now at the engine

    def restore(self, run: ResumedRun) -> None:
        self.records = list(run.reasoning)
        self.tokens = int(run.counters.get("reasoning_tokens", 0))

    def of_iteration(self, index: int) -> list[ReasoningRecord]:
        return [r for r in self.records if r.iteration == index]

    async def abort(self, prefix: str = "") -> None:
        """Abort at the engine every request in flight whose id starts with `prefix`."""
        requests = [r for r in self.requests if r.startswith(prefix)]
        await asyncio.gather(*(self.engine.abort(r) for r in requests), return_exceptions=True)

    def _params(self, seed: int | None) -> GenerationParams:
        return GenerationParams(max_tokens=self.spec.reasoning_max_tokens,
                                temperature=self.spec.temperature, top_p=self.spec.top_p,
                                seed=seed)

    async def run(self, record: IterationRecord, prompt_ids: list[int], request_id: str,
                  seed: int | None, forker: Forker | None) -> ReasoningOutcome:
        """Stream one reasoning of the iteration `record` to its end; `forker` forks it."""
        think_end = self.engine.think_end
        ids: list[int] = []
        text = ""
        answer_start: int | None = None
        finish_reason: str | None = None
        record.request_ids.append(request_id)
        stream_record = ReasoningRecord(request_id=request_id, iteration=record.index,
                                        started_at=self.clock.wall())
        self.records.append(stream_record)
        self.requests.add(request_id)
        stream = self.engine.reason(request_id, prompt_ids, self._params(seed))
        try:
            async with closing(stream):
                async for delta in stream:
                    previous_tokens, previous_len = len(ids), len(text)
                    ids.extend(delta.token_ids)
                    text += delta.text
                    stream_record.tokens += len(delta.token_ids)
                    record.reasoning_tokens += len(delta.token_ids)
                    self.tokens += len(delta.token_ids)
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
                    self._on_tokens()
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
            self.requests.discard(request_id)
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
        return ReasoningOutcome(text, ids, finish_reason, answer_start)
