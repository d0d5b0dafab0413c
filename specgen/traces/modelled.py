"""Replay of a trace's reasoning paced by a timing model, with forks written by a fork writer.

`ReplayEngine` plays a trace open-loop with its recorded timing and pre-written fork outputs.
`ModelledEngine` keeps the trace's reasoning tokens (so every mode sees the same reasoning) but
times them with a `TimingModel` and answers forks through a `ForkWriter`:

- every decoding request (reasoning or fork) advances at `timing.decode_tps(n)` tokens/s, n the
  number of requests decoding on this engine at that moment: forks slow the reasoning, and many
  concurrent forks slow each other, as on a real engine;
- a request first waits its time to first token: the prompt tokens not in the prefix cache at
  `prefill_tps`. The reasoning's own tokens are in the cache (an engine caches decoded blocks), so
  a fork pays for its suffix and the partial last block only; `prefix_cache=False` makes every
  fork pay for its whole prompt (a cache too small to hold the shared prefix), unless `kv_pool`:
  then the shared prefix's full blocks come from the remote KV pool at `kv_fetch_tps`;
- a fork's output comes from the writer (the project's fork models: the latest draft in the
  reasoning, the final answer once its kernel is named, or a real engine writing from the fork
  prompt), then streams at the decode rate. The writer sees only what precedes the fork
  position, except where its own documented premise says otherwise.

Times are divided by `speed`, as in `ReplayEngine`.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import AsyncIterator, Protocol

from specgen.engines.base import EngineError, GenerationParams, TokenDelta
from specgen.engines.request_tracking import ActiveRequest, check_fork_args
from specgen.engines.timing_model import TimingModel
from specgen.traces.format import Iteration, Trace
from specgen.traces.replay import ExtraIterations, ReplayEngine

STEP_S = 0.02          # wall seconds between decode steps
CACHE_BLOCK = 16       # tokens per prefix-cache block (vLLM's default on GPUs)


class ForkWriter(Protocol):
    """What a fork at `position` reasoning tokens writes (text; "" when it writes nothing)."""

    name: str

    async def write(self, iteration: Iteration, position: int, reasoning_text: str,
                    suffix_text: str) -> str: ...


class ModelledEngine(ReplayEngine):
    """See the module docstring."""

    name = "modelled"

    def __init__(self, trace: str | Path | Trace, writer: ForkWriter, *,
                 timing: TimingModel | None = None, speed: float = 1.0,
                 extra_iterations: ExtraIterations = "repeat_last", tokenizer: str | None = None,
                 prefix_cache: bool = True, kv_pool: bool = False) -> None:
        super().__init__(trace, speed=speed, extra_iterations=extra_iterations, tokenizer=tokenizer)
        self.writer = writer
        self.timing = timing or TimingModel()
        self.prefix_cache = prefix_cache
        self.kv_pool = kv_pool
        self.decoding = 0                      # requests in their decode phase now
        self.tokens_generated = 0
        self.forks_written = 0

    def reason(self, request_id: str, prompt_ids: list[int], params: GenerationParams) -> AsyncIterator[TokenDelta]:
        request, iteration = self._open_reasoning(request_id, prompt_ids, params)
        tokens = [*iteration.reasoning.token_ids, *iteration.final.token_ids]
        ttft = self.timing.ttft_s(len(prompt_ids))
        return self._paced(request, tokens, len(prompt_ids), 0, ttft, params)

    def fork(self, request_id: str, prompt_ids: list[int], reasoning_ids: list[int],
             suffix_ids: list[int], params: GenerationParams) -> AsyncIterator[TokenDelta]:
        check_fork_args(self.name, prompt_ids, reasoning_ids, suffix_ids, params)
        request = self._requests.open(request_id, "fork")
        prompt_len = len(prompt_ids) + len(reasoning_ids) + len(suffix_ids)
        shared = len(prompt_ids) + len(reasoning_ids)
        blocks = (shared // CACHE_BLOCK) * CACHE_BLOCK
        cached = blocks if self.prefix_cache else 0
        fetched = blocks if not self.prefix_cache and self.kv_pool else 0
        ttft = self.timing.ttft_s(prompt_len, cached_tokens=cached, fetched_tokens=fetched)
        iteration = self._iteration_of(reasoning_ids)
        # As vLLM reports it, a token loaded from the pool counts as cached.
        return self._forked(request, iteration, reasoning_ids, suffix_ids, prompt_len,
                            cached + fetched, ttft, params)

    async def _forked(self, request: ActiveRequest, iteration: Iteration, reasoning_ids: list[int],
                      suffix_ids: list[int], prompt_len: int, cached: int, ttft: float,
                      params: GenerationParams) -> AsyncIterator[TokenDelta]:
        began = time.monotonic()
        try:
            text = await self.writer.write(iteration, len(reasoning_ids), self.decode(reasoning_ids),
                                           self.decode(suffix_ids))
        except Exception as exc:  # noqa: BLE001 - a writer backed by a live engine can fail
            raise EngineError(f"modelled: fork writer {self.writer.name!r} failed: {exc}") from exc
        self.forks_written += 1
        # A writer that took real time (a live engine) has used up that much of the TTFT budget.
        spent = (time.monotonic() - began) * self.speed
        tokens = self.encode(text) if text else []
        async for delta in self._paced(request, tokens, prompt_len, cached, max(0.0, ttft - spent),
                                       params):
            yield delta

    async def _paced(self, request: ActiveRequest, tokens: list[int], prompt_len: int, cached: int,
                     ttft: float, params: GenerationParams) -> AsyncIterator[TokenDelta]:
        try:
            if await self._sleep(request, ttft / self.speed):
                yield request.abort_delta()
                return
            emitted, text_so_far, first, progress = 0, "", True, 0.0
            stop_ids = set(params.stop_token_ids)
            self.decoding += 1
            try:
                last = time.monotonic()
                while True:
                    if request.aborted:
                        yield request.abort_delta()
                        return
                    if emitted >= len(tokens):
                        yield self._first(TokenDelta(token_ids=[], text="", t=time.monotonic(),
                                                     finished=True, finish_reason="stop"),
                                          first, prompt_len, cached)
                        return
                    if await self._sleep(request, STEP_S):
                        yield request.abort_delta()
                        return
                    now = time.monotonic()
                    progress += self.timing.decode_tps(self.decoding) * (now - last) * self.speed
                    last = now
                    due = min(len(tokens), int(progress))
                    if due <= emitted:
                        continue
                    chunk = tokens[emitted:due]
                    chunk, text, finish = self._apply_limits(chunk, self.decode(chunk), emitted,
                                                             text_so_far, params, stop_ids)
                    emitted = due if finish is None else emitted + len(chunk)
                    text_so_far += text
                    self.tokens_generated += len(chunk)
                    if finish is None and emitted >= len(tokens):
                        finish = "stop"
                    yield self._first(TokenDelta(token_ids=chunk, text=text, t=now,
                                                 finished=finish is not None, finish_reason=finish),
                                      first, prompt_len, cached)
                    first = False
                    if finish is not None:
                        return
            finally:
                self.decoding -= 1
        finally:
            self._requests.close(request)

    @staticmethod
    def _first(delta: TokenDelta, first: bool, prompt_len: int, cached: int) -> TokenDelta:
        if first:
            delta.num_prompt_tokens = prompt_len
            delta.num_cached_tokens = cached
        return delta

    @staticmethod
    async def _sleep(request: ActiveRequest, seconds: float) -> bool:
        """Wait `seconds` or until the request is aborted; True when it was."""
        if seconds > 0:
            try:
                await asyncio.wait_for(request.abort_event.wait(), timeout=seconds)
            except asyncio.TimeoutError:
                pass
        return request.aborted
