"""Modelled replay: the trace's tokens paced by the timing model, forks from a writer, contention."""
from __future__ import annotations

import asyncio
import time

import pytest

from specgen.engines.base import GenerationParams
from specgen.engines.timing_model import TimingModel
from specgen.traces.format import Trace, TraceBuilder
from specgen.traces.modelled import ModelledEngine


class FixedWriter:
    name = "fixed"

    def __init__(self, text: str) -> None:
        self.text = text
        self.seen: list[tuple[int, str]] = []

    async def write(self, iteration, position, reasoning_text, suffix_text) -> str:
        self.seen.append((position, reasoning_text))
        return self.text


def small_trace(words: int = 400) -> Trace:
    builder = TraceBuilder(token_rate=1000.0, problem="softmax", hand_written=False)
    builder.add_iteration(" ".join(f"word{i}" for i in range(words)), forks=[],
                          final_text="```python\nclass ModelNew: pass\n```\n")
    return builder.build()


async def collect(stream) -> tuple[list[int], str, float, object]:
    began = time.monotonic()
    ids, text, first = [], "", None
    async for delta in stream:
        first = first or delta
        ids += delta.token_ids
        text += delta.text
    return ids, text, time.monotonic() - began, first


def test_reasoning_takes_its_tokens_at_the_decode_rate() -> None:
    trace = small_trace()
    tokens = trace.iterations[0].reasoning.num_tokens + trace.iterations[0].final.num_tokens
    timing = TimingModel(r1=tokens / 2.0, ttft_floor_s=0.0, prefill_tps=1e9)
    engine = ModelledEngine(trace, FixedWriter(""), timing=timing, speed=4.0)
    ids, text, seconds, _ = asyncio.run(collect(engine.reason("r", [1, 2, 3], GenerationParams(max_tokens=10**6))))
    assert ids == trace.iterations[0].reasoning.token_ids + trace.iterations[0].final.token_ids
    assert text == trace.iterations[0].reasoning.text + trace.iterations[0].final.text
    assert 0.5 * 0.8 < seconds < 0.5 * 1.6          # 2 s of decoding at speed 4


def test_a_fork_sees_only_the_reasoning_before_it_and_pays_for_the_uncached_part() -> None:
    trace = small_trace()
    writer = FixedWriter("```python\nclass ModelNew: pass\n```\n")
    engine = ModelledEngine(trace, writer, timing=TimingModel(prefill_tps=100.0, ttft_floor_s=0.0), speed=1.0)
    reasoning = trace.iterations[0].reasoning.token_ids
    suffix = engine.encode("</think> now the code")

    async def fork(cache: bool):
        engine.prefix_cache = cache
        return await collect(engine.fork("f", [1] * 10, reasoning[:100], suffix, GenerationParams()))

    ids, text, cached_s, first = asyncio.run(fork(True))
    assert text == writer.text and first.num_cached_tokens == 96       # whole 16-token blocks
    assert writer.seen[-1] == (100, engine.decode(reasoning[:100]))
    _, _, uncached_s, first = asyncio.run(fork(False))
    assert first.num_cached_tokens == 0
    assert uncached_s > cached_s + 0.8                                  # 96 tokens at 100/s
    engine.kv_pool = True                   # evicted locally, fetched from the pool instead
    _, _, pooled_s, first = asyncio.run(fork(False))
    assert first.num_cached_tokens == 96
    assert pooled_s < cached_s + 0.2                                    # 96 tokens at 16,900/s


def test_concurrent_decoding_slows_every_request() -> None:
    trace = small_trace(words=200)
    timing = TimingModel(r1=400.0, knee=1.0, beta=1.0, ttft_floor_s=0.0, prefill_tps=1e9)

    async def run(n: int) -> float:
        engine = ModelledEngine(trace, FixedWriter(""), timing=timing, speed=1.0)
        runs = [collect(engine.reason(f"r{i}", [1], GenerationParams(max_tokens=200))) for i in range(n)]
        return max(r[2] for r in await asyncio.gather(*runs))

    alone, four = asyncio.run(run(1)), asyncio.run(run(4))
    assert four > 2.5 * alone          # rate per request / 4 with beta = 1


def test_abort_ends_a_paced_stream() -> None:
    engine = ModelledEngine(small_trace(), FixedWriter(""), timing=TimingModel(r1=10.0), speed=1.0)

    async def main():
        stream = engine.reason("r", [1], GenerationParams(max_tokens=10**6))
        task = asyncio.ensure_future(collect(stream))
        await asyncio.sleep(0.3)
        began = time.monotonic()
        await engine.abort("r")
        await task
        return time.monotonic() - began, task.result()

    waited, (_, _, _, _) = asyncio.run(main())
    assert waited < 0.2
