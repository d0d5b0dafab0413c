"""The vLLM in-process backend on vLLM's real CPU engine with the tiny model (one engine per session)."""
from __future__ import annotations

import asyncio
import time

import pytest

from specgen.engines.base import EngineError, GenerationParams, TokenDelta

pytestmark = pytest.mark.vllm

SUFFIX = "</think>\n\nI will now write the final ModelNew code.\n"


async def _collect(stream) -> tuple[list[TokenDelta], list[int]]:
    deltas = [delta async for delta in stream]
    return deltas, [t for d in deltas for t in d.token_ids]


def _long_prompt(engine, words: int) -> list[int]:
    content = " ".join(f"step{i % 97} of the kernel plan" for i in range(words))
    return engine.chat_prompt_ids([{"role": "user", "content": content}])


async def _fork_ttft(engine, request_id: str, prompt, reasoning, suffix) -> tuple[float, TokenDelta, list[int]]:
    start = time.monotonic()
    first: TokenDelta | None = None
    ids: list[int] = []
    async for delta in engine.fork(request_id, prompt, reasoning, suffix, GenerationParams(max_tokens=8)):
        if first is None:
            first = delta
            ttft = delta.t - start
        ids += delta.token_ids
    assert first is not None
    return ttft, first, ids


def test_fork_prompt_is_served_from_prefix_cache(loop, tiny_vllm_engine) -> None:
    engine = tiny_vllm_engine
    prompt = _long_prompt(engine, 700)
    suffix = engine.encode(SUFFIX)

    async def run() -> None:
        await engine.reset_prefix_cache()
        reasoning: list[int] = []
        forks: list[tuple[float, TokenDelta, list[int]]] = []
        # Fork while the reasoning stream is still running, from its exact ids so far.
        async for delta in engine.reason("cache-reason", prompt, GenerationParams(max_tokens=600)):
            reasoning += delta.token_ids
            if len(reasoning) >= 400 and not forks:
                forks.append(await _fork_ttft(engine, "cache-fork-live", prompt, reasoning[:400], suffix))
        ttft_live, first_live, ids_live = forks[0]
        prefix = len(prompt) + 400
        assert first_live.num_prompt_tokens == prefix + len(suffix)
        # Blocks of 128 tokens (CPU engine): the whole prompt plus decoded blocks are cached.
        assert first_live.num_cached_tokens >= (prefix // 128 - 1) * 128 > len(prompt)

        cached = [await _fork_ttft(engine, f"cache-fork-hot-{i}", prompt, reasoning[:400], suffix) for i in range(3)]
        cold = []
        for i in range(3):
            await engine.reset_prefix_cache()
            cold.append(await _fork_ttft(engine, f"cache-fork-cold-{i}", prompt, reasoning[:400], suffix))
        assert all(first.num_cached_tokens == 0 for _, first, _ in cold)
        assert all(first.num_cached_tokens > len(prompt) for _, first, _ in cached)
        assert min(t for t, _, _ in cached) < min(t for t, _, _ in cold)
        # The cache changes timing, not content: same greedy tokens either way.
        assert cached[0][2] == cold[0][2] == ids_live

    loop.run(run(), timeout_s=300)


def test_fork_equals_generation_from_concatenated_ids(loop, tiny_vllm_engine) -> None:
    engine = tiny_vllm_engine
    prompt = engine.chat_prompt_ids([{"role": "user", "content": "Write a fast ReLU."}])

    async def run() -> None:
        _, reasoning = await _collect(engine.reason("concat-reason", prompt, GenerationParams(max_tokens=150)))
        assert len(reasoning) == 150
        suffix = engine.encode(SUFFIX)
        _, forked = await _collect(engine.fork("concat-fork", prompt, reasoning[:90], suffix, GenerationParams(max_tokens=20)))
        _, direct = await _collect(engine.reason("concat-direct", prompt + reasoning[:90] + suffix, GenerationParams(max_tokens=20)))
        assert forked == direct and len(forked) == 20
        # Text and ids agree: the deltas' texts are the decoded ids.
        deltas, _ = await _collect(engine.reason("concat-text", prompt, GenerationParams(max_tokens=40)))
        assert "".join(d.text for d in deltas) == engine.decode([t for d in deltas for t in d.token_ids])

    loop.run(run(), timeout_s=300)


def test_abort_stops_generation_and_engine_keeps_serving(loop, tiny_vllm_engine) -> None:
    engine = tiny_vllm_engine
    prompt = engine.chat_prompt_ids([{"role": "user", "content": "Think for a long time."}])

    async def run() -> None:
        _, reference = await _collect(engine.reason("abort-ref", prompt, GenerationParams(max_tokens=30)))
        received: list[int] = []
        after_abort: list[TokenDelta] = []
        aborted_at: float | None = None
        async for delta in engine.reason("abort-me", prompt, GenerationParams(max_tokens=6000)):
            if aborted_at is not None:
                after_abort.append(delta)
                continue
            received += delta.token_ids
            if len(received) >= 20:
                aborted_at = time.monotonic()
                await engine.abort("abort-me")
        assert aborted_at is not None and 20 <= len(received) < 6000
        # After the abort call: exactly one delta, empty, finish_reason "abort".
        assert len(after_abort) == 1
        assert after_abort[0].finish_reason == "abort" and after_abort[0].finished and not after_abort[0].token_ids
        assert after_abort[0].t - aborted_at < 0.05
        for _ in range(100):                 # the engine core drops the request too
            if engine.async_llm.get_num_unfinished_requests() == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.async_llm.get_num_unfinished_requests() == 0
        # Still serving, deterministically, and the aborted id can be used again.
        _, again = await _collect(engine.reason("abort-me", prompt, GenerationParams(max_tokens=30)))
        assert again == reference

        # Closing a stream early (consumer stops reading) also aborts it in the engine.
        stream = engine.reason("abort-by-close", prompt, GenerationParams(max_tokens=6000))
        async for delta in stream:
            if delta.token_ids:
                break
        await stream.aclose()
        for _ in range(100):
            if engine.async_llm.get_num_unfinished_requests() == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.async_llm.get_num_unfinished_requests() == 0

    loop.run(run(), timeout_s=300)


def test_many_concurrent_forks(loop, tiny_vllm_engine) -> None:
    engine = tiny_vllm_engine
    prompt = _long_prompt(engine, 150)
    suffix = engine.encode(SUFFIX)

    async def run() -> None:
        reasoning: list[int] = []
        reasoning_times: list[float] = []
        tasks: list[asyncio.Task] = []
        async for delta in engine.reason("many-reason", prompt, GenerationParams(max_tokens=1600)):
            reasoning += delta.token_ids
            reasoning_times.append(delta.t)
            if len(reasoning) >= 1024 and not tasks:
                # 16 forks at once, at different positions, while the reasoning keeps going.
                tasks = [
                    asyncio.ensure_future(_collect(engine.fork(
                        f"many-fork-{position}", prompt, reasoning[:position], suffix, GenerationParams(max_tokens=48)
                    )))
                    for position in range(64, 1025, 64)
                ]
        assert len(tasks) == 16
        results = await asyncio.gather(*tasks)
        for deltas, ids in results:
            assert len(ids) == 48 and deltas[-1].finish_reason == "length"
            assert deltas[0].num_cached_tokens >= 128      # at least the prompt's first block
        # The forks were in flight together (all 16 at the peak, but a loaded machine may let the
        # first finish before the last is admitted), and the reasoning streamed meanwhile.
        events = sorted([(d[0].t, 1) for d, _ in results] + [(d[-1].t, -1) for d, _ in results])
        in_flight = peak = 0
        for _, step in events:
            in_flight += step
            peak = max(peak, in_flight)
        assert peak >= 12
        first_start, last_end = events[0][0], events[-1][0]
        assert sum(1 for t in reasoning_times if first_start < t < last_end) >= 2
        # Forks from different positions differ; their prompts were not mixed up.
        assert len({tuple(ids) for _, ids in results}) > 1

    loop.run(run(), timeout_s=300)


def test_bad_requests_give_clear_errors(loop, tiny_vllm_engine) -> None:
    engine = tiny_vllm_engine

    async def run() -> None:
        with pytest.raises(EngineError, match="does not fit.*max_model_len"):
            await _collect(engine.reason("too-long", [5] * 9000, GenerationParams(max_tokens=5)))
        with pytest.raises(EngineError, match="99999"):
            await _collect(engine.reason("bad-id", [5, 99999], GenerationParams(max_tokens=5)))
        stream = engine.reason("dup", [5, 6, 7], GenerationParams(max_tokens=5))
        with pytest.raises(EngineError, match="'dup' is already running"):
            engine.reason("dup", [5, 6, 7], GenerationParams(max_tokens=5))
        _, ids = await _collect(stream)
        assert len(ids) == 5
        with pytest.raises(EngineError, match="empty prompt"):
            engine.fork("empty", [], [], [], GenerationParams())
        with pytest.raises(EngineError, match=r"reasoning_ids\[0\]"):
            engine.fork("neg", [1], [-1], [], GenerationParams())

    loop.run(run(), timeout_s=120)


def test_engine_that_cannot_start_says_why(loop, tmp_path) -> None:
    from specgen.engines.vllm_engine import VLLMEngine

    (tmp_path / "tokenizer_config.json").write_text("{}")
    engine = VLLMEngine(str(tmp_path / "no-such-model"))
    with pytest.raises(EngineError, match="no-such-model"):
        loop.run(engine.start(), timeout_s=120)
    with pytest.raises(EngineError, match="not started"):
        engine.reason("x", [1], GenerationParams())
    # A directory that exists but holds no model: vLLM's own complaint, wrapped, naming the model.
    with pytest.raises(EngineError, match=str(tmp_path)):
        loop.run(VLLMEngine(str(tmp_path)).start(), timeout_s=120)
