"""Records traces from a live engine, forking while the reasoning runs, as specgen does.

For each iteration the recorder streams a reasoning generation and, whenever the reasoning passes a
fork position, starts a fork from exactly the ids so far plus the suffix, concurrently with the
still-running reasoning (so the recorded fork timing includes that contention, as in a real run).
Chunks are stored as the engine streamed them, with times from each request's start. The
generation is split at the think-end tag into reasoning and final answer.

Between iterations, `next_messages(iteration_index, messages, final_text)` gives the next chat (for
instance with evaluation feedback appended), or None to stop early.
"""
from __future__ import annotations

import asyncio
import datetime as _datetime
import time
from dataclasses import dataclass
from typing import Callable

from specgen.engines.base import Engine, EngineError, GenerationParams, TokenDelta
from specgen.traces.format import (
    DEFAULT_FORK_SUFFIX,
    HUGGINGFACE_KIND,
    Chunk,
    ForkRecording,
    Iteration,
    Segment,
    Trace,
    TraceMetadata,
)
from specgen.traces.tokenizer import TOKENIZER_KIND as PIECES_KIND

NextMessages = Callable[[int, list[dict[str, str]], str], "list[dict[str, str]] | None"]


@dataclass
class RecordingPlan:
    """What to record.

    Attributes:
        fork_every: fork each time the reasoning grows by this many tokens (0: no periodic forks).
        fork_positions: explicit reasoning token counts to fork at (added to the periodic ones).
        max_forks: an upper bound on forks per iteration.
        suffix_text: appended after the reasoning so far in every fork prompt.
        reasoning: generation parameters of the reasoning stream.
        fork: generation parameters of the forks.
        iterations: how many iterations to record.
    """

    fork_every: int = 256
    fork_positions: tuple[int, ...] = ()
    max_forks: int = 64
    suffix_text: str = DEFAULT_FORK_SUFFIX
    reasoning: GenerationParams = None  # type: ignore[assignment]
    fork: GenerationParams = None  # type: ignore[assignment]
    iterations: int = 1

    def __post_init__(self) -> None:
        if self.reasoning is None:
            self.reasoning = GenerationParams(max_tokens=8192)
        if self.fork is None:
            self.fork = GenerationParams(max_tokens=2048)
        if self.fork_every < 0:
            raise ValueError(f"fork_every must be >= 0, got {self.fork_every}")
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {self.iterations}")

    def positions(self, limit: int) -> list[int]:
        wanted = set(p for p in self.fork_positions if 0 < p <= limit)
        if self.fork_every:
            wanted.update(range(self.fork_every, limit + 1, self.fork_every))
        return sorted(wanted)[: self.max_forks]


def default_next_messages(index: int, messages: list[dict[str, str]], final_text: str) -> list[dict[str, str]]:
    """Feed the answer back and ask for a better one (no evaluator is involved in recording)."""
    return [
        *messages,
        {"role": "assistant", "content": final_text},
        {"role": "user", "content": "Your ModelNew was correct. Make it faster; answer with the complete new ModelNew."},
    ]


def tokenizer_spec_of(engine: Engine) -> dict[str, str]:
    """How a trace names the tokenizer of `engine`'s ids."""
    from specgen.traces.replay import ReplayEngine

    if isinstance(engine, ReplayEngine):
        return dict(engine.trace.metadata.tokenizer)
    hf = getattr(engine, "_tokenizer", None)
    path = getattr(hf, "path", None)
    if isinstance(path, str):
        return {"kind": HUGGINGFACE_KIND, "name_or_path": path}
    raise EngineError(f"recorder: cannot tell which tokenizer {type(engine).__name__} uses")


class _TimedSegment:
    def __init__(self, start: float) -> None:
        self.start = start
        self.chunks: list[Chunk] = []

    def add(self, delta: TokenDelta) -> None:
        if delta.token_ids:
            self.chunks.append(Chunk(t=max(0.0, delta.t - self.start), token_ids=list(delta.token_ids), text=delta.text))


async def _record_fork(engine: Engine, request_id: str, prompt_ids: list[int], reasoning_ids: list[int],
                       suffix_ids: list[int], params: GenerationParams) -> Segment:
    segment = _TimedSegment(time.monotonic())
    async for delta in engine.fork(request_id, prompt_ids, reasoning_ids, suffix_ids, params):
        segment.add(delta)
        if delta.finished and delta.finish_reason == "abort":
            raise EngineError(f"recorder: fork {request_id!r} was aborted")
    return Segment(segment.chunks)


def _find(ids: list[int], pattern: list[int], start: int) -> int | None:
    width = len(pattern)
    if not width:
        return None
    for i in range(start, len(ids) - width + 1):
        if ids[i:i + width] == pattern:
            return i
    return None


def _split_at_think_end(engine: Engine, chunks: list[Chunk], think_end_ids: list[int]) -> tuple[Segment, Segment]:
    """Reasoning = tokens before the first think-end tag; final = the tag and everything after."""
    flat = [(index, token_id) for index, chunk in enumerate(chunks) for token_id in chunk.token_ids]
    cut = _find([token_id for _, token_id in flat], think_end_ids, 0)
    if cut is None:
        return Segment(list(chunks)), Segment([])
    chunk_index = flat[cut][0]
    offset = cut - sum(len(chunks[i].token_ids) for i in range(chunk_index))
    reasoning = list(chunks[:chunk_index])
    final = list(chunks[chunk_index + 1:])
    split = chunks[chunk_index]
    head_ids, tail_ids = split.token_ids[:offset], split.token_ids[offset:]
    if head_ids:
        reasoning.append(Chunk(t=split.t, token_ids=head_ids, text=engine.decode(head_ids)))
    final.insert(0, Chunk(t=split.t, token_ids=tail_ids, text=split.text[len(engine.decode(head_ids)):] if head_ids else split.text))
    return Segment(reasoning), Segment(final)


async def record_trace(
    engine: Engine,
    messages: list[dict[str, str]],
    *,
    problem: str,
    model: str,
    plan: RecordingPlan | None = None,
    next_messages: NextMessages = default_next_messages,
    notes: str = "",
    request_prefix: str = "record",
) -> Trace:
    """Record `plan.iterations` iterations of reasoning with forks from a started `engine`."""
    plan = plan or RecordingPlan()
    think_end_ids = engine.encode(engine.think_end)
    suffix_ids = engine.encode(plan.suffix_text)
    iterations: list[Iteration] = []
    current = list(messages)
    for iteration_index in range(plan.iterations):
        prompt_ids = engine.chat_prompt_ids(current)
        positions = plan.positions(plan.reasoning.max_tokens)
        reasoning_ids: list[int] = []
        generation = _TimedSegment(time.monotonic())
        fork_tasks: list[tuple[int, asyncio.Task[Segment]]] = []
        closed = False
        reason_id = f"{request_prefix}-{iteration_index}-reason"
        try:
            async for delta in engine.reason(reason_id, prompt_ids, plan.reasoning):
                generation.add(delta)
                before = len(reasoning_ids)
                if not closed:
                    reasoning_ids.extend(delta.token_ids)
                    # The tag may straddle two deltas: search from just before this delta's tokens.
                    cut = _find(reasoning_ids, think_end_ids, max(0, before - len(think_end_ids) + 1))
                    if cut is not None:
                        closed = True
                        del reasoning_ids[cut:]
                while positions and positions[0] <= len(reasoning_ids):
                    position = positions.pop(0)
                    fork_id = f"{request_prefix}-{iteration_index}-fork-{position}"
                    task = asyncio.ensure_future(_record_fork(
                        engine, fork_id, prompt_ids, reasoning_ids[:position], suffix_ids, plan.fork
                    ))
                    fork_tasks.append((position, task))
                if closed:
                    positions = []
                if delta.finished and delta.finish_reason == "abort":
                    raise EngineError(f"recorder: reasoning {reason_id!r} was aborted")
            forks = [ForkRecording(position=p, completion=await task, suffix_text=plan.suffix_text) for p, task in fork_tasks]
            # A fork launched just before a multi-token tag was complete may hold part of the tag.
            forks = [fork for fork in forks if fork.position <= len(reasoning_ids)]
        except BaseException:
            for _, task in fork_tasks:
                task.cancel()
            await asyncio.gather(*(task for _, task in fork_tasks), return_exceptions=True)
            raise
        reasoning, final = _split_at_think_end(engine, generation.chunks, think_end_ids)
        iterations.append(Iteration(reasoning=reasoning, final=final, forks=forks, messages=list(current)))
        if iteration_index + 1 < plan.iterations:
            following = next_messages(iteration_index, current, final.text)
            if following is None:
                break
            current = following
    tokenizer = tokenizer_spec_of(engine)
    vocab = None
    if tokenizer["kind"] == PIECES_KIND:
        vocab = engine.trace.vocab  # type: ignore[attr-defined]
    metadata = TraceMetadata(
        model=model,
        tokenizer=tokenizer,
        hand_written=False,
        problem=problem,
        token_rate=None,
        notes=notes,
        think_end=engine.think_end,
        created=_datetime.datetime.now(_datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    return Trace(metadata=metadata, iterations=iterations, vocab=vocab)
