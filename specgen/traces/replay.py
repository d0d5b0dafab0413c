"""Replay of recorded traces with their recorded timing: tests, demos and trace-driven experiments.

- `reason()`: the k-th call replays iteration k of the trace (reasoning, then the think-end tag and
  the final answer), each chunk at its recorded time divided by `speed`. When the loop runs more
  iterations than the trace holds, `extra_iterations` decides: "repeat_last" (default: the last
  recorded iteration again, the state the recording ended in) or "wrap" (start over from the first).
- `fork()`: serves the recording made at `len(reasoning_ids)` or, when nothing was recorded there,
  the nearest earlier one, timed as recorded (from the fork call). The iteration is the one whose
  recorded reasoning begins with `reasoning_ids`; if none does, the latest `reason()` call's. A fork
  before the iteration's first recording gets an empty completion (finish_reason "stop"): the model
  had produced no code that early.
- `abort()` ends a stream at once, also while it waits for a chunk's time.

Replay has no prefix cache: deltas report `num_prompt_tokens` but leave `num_cached_tokens` None.
Hand-written traces carry their own tokenizer (a piece vocabulary), so `encode` works on any text;
traces recorded from a model name its tokenizer directory, or pass `tokenizer=` to point at one.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import AsyncIterator, Iterable, Literal

from specgen.engines.base import Engine, EngineError, GenerationParams, TokenDelta
from specgen.engines.request_tracking import ActiveRequest, ActiveRequests, check_fork_args, check_params, check_prompt_ids
from specgen.traces.format import Chunk, Iteration, Trace

ExtraIterations = Literal["repeat_last", "wrap"]


class ReplayEngine(Engine):
    """Serves a trace as if a live engine produced it.

    Args:
        trace: a trace file or a loaded `Trace`.
        speed: time scale; 2.0 replays twice as fast, `float("inf")` without waiting.
        extra_iterations: "repeat_last" or "wrap" (see the module docstring).
        tokenizer: a local tokenizer directory overriding the one the trace names.
    """

    name = "replay"

    def __init__(
        self,
        trace: str | Path | Trace,
        *,
        speed: float = 1.0,
        extra_iterations: ExtraIterations = "repeat_last",
        tokenizer: str | None = None,
    ) -> None:
        if not speed > 0:
            raise EngineError(f"replay: speed must be > 0, got {speed}")
        if extra_iterations not in ("repeat_last", "wrap"):
            raise EngineError(f"replay: extra_iterations must be 'repeat_last' or 'wrap', got {extra_iterations!r}")
        self.trace = trace if isinstance(trace, Trace) else Trace.load(trace)
        self.speed = speed
        self.extra_iterations: ExtraIterations = extra_iterations
        self.think_end = self.trace.metadata.think_end
        self._tokenizer = self.trace.tokenizer(tokenizer)
        self._reason_calls = 0
        self._latest_iteration = 0
        self._requests = ActiveRequests(self.name)

    @property
    def reason_calls(self) -> int:
        """How many reasoning requests were served (the next one replays this iteration index)."""
        return self._reason_calls

    def iteration_for_call(self, call_index: int) -> int:
        count = len(self.trace.iterations)
        if call_index < count:
            return call_index
        return count - 1 if self.extra_iterations == "repeat_last" else call_index % count

    # -- tokens ----------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text)

    def decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids)

    def chat_prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        try:
            return self._tokenizer.chat_prompt_ids(messages)
        except ValueError as exc:
            raise EngineError(f"replay: {exc}") from exc

    # -- generation ------------------------------------------------------------------------------

    def reason(self, request_id: str, prompt_ids: list[int], params: GenerationParams) -> AsyncIterator[TokenDelta]:
        request, iteration = self._open_reasoning(request_id, prompt_ids, params)
        return self._play(request, [*iteration.reasoning.chunks, *iteration.final.chunks], len(prompt_ids), params)

    def _open_reasoning(self, request_id: str, prompt_ids: list[int],
                        params: GenerationParams) -> tuple[ActiveRequest, Iteration]:
        """Check a reasoning request and pick the iteration it replays."""
        check_prompt_ids(self.name, "prompt_ids", prompt_ids)
        check_params(self.name, params)
        request = self._requests.open(request_id, "reason")
        index = self.iteration_for_call(self._reason_calls)
        self._reason_calls += 1
        self._latest_iteration = index
        return request, self.trace.iterations[index]

    def fork(
        self,
        request_id: str,
        prompt_ids: list[int],
        reasoning_ids: list[int],
        suffix_ids: list[int],
        params: GenerationParams,
    ) -> AsyncIterator[TokenDelta]:
        check_fork_args(self.name, prompt_ids, reasoning_ids, suffix_ids, params)
        request = self._requests.open(request_id, "fork")
        iteration = self._iteration_of(reasoning_ids)
        recording = iteration.fork_at(len(reasoning_ids))
        chunks = recording.completion.chunks if recording is not None else []
        prompt_len = len(prompt_ids) + len(reasoning_ids) + len(suffix_ids)
        return self._play(request, chunks, prompt_len, params)

    def _iteration_of(self, reasoning_ids: list[int]) -> Iteration:
        iterations = self.trace.iterations
        # Latest served first: repeated iterations are identical, and it is the likeliest match.
        order = [self._latest_iteration] + [i for i in range(len(iterations)) if i != self._latest_iteration]
        for index in order:
            recorded = iterations[index].reasoning.token_ids
            if recorded[: len(reasoning_ids)] == list(reasoning_ids) and len(reasoning_ids) <= len(recorded):
                return iterations[index]
        return iterations[self._latest_iteration]

    async def abort(self, request_id: str) -> None:
        self._requests.mark_aborted(request_id)

    async def _play(
        self, request: ActiveRequest, chunks: list[Chunk], prompt_len: int, params: GenerationParams
    ) -> AsyncIterator[TokenDelta]:
        try:
            start = time.monotonic()
            emitted = 0
            text_so_far = ""
            first = True
            position = 0
            stop_ids = set(params.stop_token_ids)
            while True:
                if request.aborted:
                    yield request.abort_delta()
                    return
                if position >= len(chunks):
                    yield self._delta([], "", first, prompt_len, finish_reason="stop")
                    return
                due = start + chunks[position].t / self.speed
                wait = due - time.monotonic()
                if wait > 0:
                    try:
                        await asyncio.wait_for(request.abort_event.wait(), timeout=wait)
                    except asyncio.TimeoutError:
                        pass
                    continue
                # Every chunk already due goes out in one delta, as an engine step would batch them.
                token_ids: list[int] = []
                text = ""
                now = time.monotonic()
                while position < len(chunks) and start + chunks[position].t / self.speed <= now:
                    token_ids.extend(chunks[position].token_ids)
                    text += chunks[position].text
                    position += 1
                token_ids, text, finish_reason = self._apply_limits(
                    token_ids, text, emitted, text_so_far, params, stop_ids
                )
                emitted += len(token_ids)
                text_so_far += text
                if finish_reason is None and position >= len(chunks):
                    finish_reason = "stop"
                yield self._delta(token_ids, text, first, prompt_len, finish_reason=finish_reason)
                first = False
                if finish_reason is not None:
                    return
        finally:
            self._requests.close(request)

    def _apply_limits(
        self,
        token_ids: list[int],
        text: str,
        emitted: int,
        text_so_far: str,
        params: GenerationParams,
        stop_ids: set[int],
    ) -> tuple[list[int], str, str | None]:
        """Cut a delta at max_tokens, a stop token or a stop string, as an engine would."""
        finish_reason: str | None = None
        room = params.max_tokens - emitted
        if len(token_ids) >= room:
            if len(token_ids) > room:
                token_ids = token_ids[:room]
                text = self.decode(token_ids)
            finish_reason = "length"
        for index, token_id in enumerate(token_ids):
            if token_id in stop_ids:
                token_ids = token_ids[: index + 1]
                text = self.decode(token_ids)
                finish_reason = "stop"
                break
        if params.stop:
            combined = text_so_far + text
            hits = [combined.find(stop, max(0, len(text_so_far) - len(stop) + 1)) for stop in params.stop]
            hits = [hit for hit in hits if hit >= 0]
            if hits:
                cut = min(hits) - len(text_so_far)
                text = text[: max(cut, 0)]
                finish_reason = "stop"
        return token_ids, text, finish_reason

    @staticmethod
    def _delta(token_ids: list[int], text: str, first: bool, prompt_len: int, finish_reason: str | None) -> TokenDelta:
        delta = TokenDelta(
            token_ids=token_ids, text=text, t=time.monotonic(),
            finished=finish_reason is not None, finish_reason=finish_reason,
        )
        if first:
            delta.num_prompt_tokens = prompt_len
        return delta


def load_traces(paths: Iterable[str | Path]) -> list[Trace]:
    """Load several trace files (each validated; the first bad one raises naming its file)."""
    return [Trace.load(path) for path in paths]
