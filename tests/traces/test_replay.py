from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from specgen.engines.base import EngineError, GenerationParams, TokenDelta
from specgen.traces.format import Trace, TraceBuilder, TraceFormatError
from specgen.traces.replay import ReplayEngine

RATE = 400.0   # tokens/s: fast enough for tests, slow enough to measure


def _trace() -> Trace:
    builder = TraceBuilder(token_rate=RATE, problem="p", ttft_s=0.05, fork_ttft_s=0.02)
    builder.add_iteration(
        "First iteration reasoning about a kernel. " * 6 + "KERNEL_ONE. " + "More careful thoughts. " * 6,
        forks={"KERNEL_ONE.": "kernel one code", 120: "kernel two code"},
        final_text="final answer one",
    )
    builder.add_iteration("Second iteration: tune warps. " * 5, forks={10: "kernel three code"}, final_text="final two")
    return builder.build()


async def _collect(stream) -> tuple[list[TokenDelta], list[int], str]:
    deltas = [delta async for delta in stream]
    ids = [t for d in deltas for t in d.token_ids]
    return deltas, ids, "".join(d.text for d in deltas)


def _messages() -> list[dict[str, str]]:
    return [{"role": "user", "content": "Make ReLU fast."}]


def test_reason_streams_iterations_with_recorded_timing(loop) -> None:
    trace = _trace()
    engine = ReplayEngine(trace, speed=2.0)
    prompt = engine.chat_prompt_ids(_messages())

    async def run() -> None:
        start = time.monotonic()
        deltas, ids, text = await _collect(engine.reason("r0", prompt, GenerationParams()))
        elapsed = time.monotonic() - start
        first = trace.iterations[0]
        assert ids == first.reasoning.token_ids + first.final.token_ids
        assert text == first.reasoning.text + first.final.text
        assert deltas[0].num_prompt_tokens == len(prompt) and deltas[0].num_cached_tokens is None
        assert deltas[-1].finished and deltas[-1].finish_reason == "stop"
        recorded = first.final.chunks[-1].t
        assert recorded / 2.0 <= elapsed < recorded / 2.0 + 0.5      # scaled by the speed factor (slack: loaded CI)
        # Arrival times follow the recorded ones (scaled), not a burst at the end.
        assert deltas[len(deltas) // 2].t - start == pytest.approx(
            first.reasoning.chunks[0].t / 2.0 + (deltas[len(deltas) // 2].t - deltas[0].t), abs=0.15
        )
        _, ids2, _ = await _collect(engine.reason("r1", prompt, GenerationParams()))
        assert ids2 == trace.iterations[1].reasoning.token_ids + trace.iterations[1].final.token_ids

    loop.run(run())


@pytest.mark.parametrize("policy,expected", [("repeat_last", [0, 1, 1, 1]), ("wrap", [0, 1, 0, 1])])
def test_extra_iterations_policy(loop, policy: str, expected: list[int]) -> None:
    trace = _trace()
    engine = ReplayEngine(trace, speed=float("inf"), extra_iterations=policy)

    async def run() -> list[int]:
        served = []
        for call in range(4):
            _, ids, _ = await _collect(engine.reason(f"r{call}", [1, 2], GenerationParams()))
            served.append(next(i for i, it in enumerate(trace.iterations) if it.reasoning.token_ids == ids[: it.reasoning.num_tokens]))
        return served

    assert loop.run(run()) == expected


def test_fork_serves_nearest_earlier_recording_timed_as_recorded(loop) -> None:
    trace = _trace()
    engine = ReplayEngine(trace, speed=1.0)
    reasoning = trace.iterations[0].reasoning.token_ids
    marker_position = trace.iterations[0].forks[0].position
    suffix = engine.encode("</think>\nNow the code:")

    async def fork_text(position: int, request_id: str) -> tuple[str, float, list[TokenDelta]]:
        start = time.monotonic()
        deltas, _, text = await _collect(engine.fork(request_id, [1], reasoning[:position], suffix, GenerationParams()))
        return text, time.monotonic() - start, deltas

    async def run() -> None:
        assert (await fork_text(marker_position, "a"))[0] == "kernel one code"
        assert (await fork_text(marker_position + 7, "b"))[0] == "kernel one code"   # nothing recorded there
        text, elapsed, deltas = await fork_text(200, "c")
        assert text == "kernel two code"
        completion = trace.iterations[0].forks[1].completion
        assert completion.chunks[-1].t <= elapsed < completion.chunks[-1].t + 0.5
        assert deltas[0].num_prompt_tokens == 1 + min(200, len(reasoning)) + len(suffix)
        # Before the first recording the model had written no code: an empty completion.
        text, _, deltas = await fork_text(3, "d")
        assert text == "" and deltas[-1].finish_reason == "stop"
        # Forks of the second iteration are found by their reasoning ids.
        second = trace.iterations[1].reasoning.token_ids
        _, _, text = await _collect(engine.fork("e", [1], second[:30], suffix, GenerationParams()))
        assert text == "kernel three code"

    loop.run(run())


def test_abort_ends_a_waiting_stream_promptly(loop) -> None:
    builder = TraceBuilder(token_rate=2.0, problem="slow", ttft_s=0.0)   # one token every 0.5 s
    builder.add_iteration("slow reasoning " * 20, forks={}, final_text="never reached")
    engine = ReplayEngine(builder.build())

    async def run() -> None:
        stream = engine.reason("slow", [1], GenerationParams())
        first = await stream.__anext__()
        assert first.token_ids
        pending = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.1)                 # the stream now waits for its next chunk's time
        called = time.monotonic()
        await engine.abort("slow")
        last = await pending
        assert last.finished and last.finish_reason == "abort" and not last.token_ids
        assert time.monotonic() - called < 0.2   # prompt, with slack for a loaded machine
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
        # The id is free again and the engine keeps serving.
        _, ids, _ = await _collect(engine.reason("slow", [1], GenerationParams(max_tokens=1)))
        assert len(ids) == 1

    loop.run(run())


def test_generation_limits(loop) -> None:
    full = _trace().iterations[0]

    def engine() -> ReplayEngine:   # a fresh one each time: every call then replays iteration 0
        return ReplayEngine(_trace(), speed=float("inf"))

    async def run() -> None:
        deltas, ids, _ = await _collect(engine().reason("a", [1], GenerationParams(max_tokens=7)))
        assert ids == full.reasoning.token_ids[:7] and deltas[-1].finish_reason == "length"
        stop_id = full.reasoning.token_ids[4]
        deltas, ids, _ = await _collect(engine().reason("b", [1], GenerationParams(stop_token_ids=[stop_id])))
        assert ids[-1] == stop_id and len(ids) <= 5 and deltas[-1].finish_reason == "stop"
        deltas, _, text = await _collect(engine().reason("c", [1], GenerationParams(stop=["KERNEL_ONE"])))
        assert text == full.reasoning.text.split("KERNEL_ONE")[0] and deltas[-1].finish_reason == "stop"

    loop.run(run())


def test_bad_input_gives_clear_errors(loop, tmp_path: Path) -> None:
    engine = ReplayEngine(_trace(), speed=float("inf"))

    async def run() -> None:
        stream = engine.reason("dup", [1], GenerationParams())
        with pytest.raises(EngineError, match="'dup' is already running"):
            engine.reason("dup", [1], GenerationParams())
        await stream.aclose()
        with pytest.raises(EngineError, match=r"prompt_ids\[1\] = -4"):
            engine.reason("x", [1, -4], GenerationParams())
        with pytest.raises(EngineError, match="max_tokens must be >= 1"):
            engine.fork("x", [1], [], [], GenerationParams(max_tokens=0))
        await engine.abort("never-started")    # unknown ids are ignored

    loop.run(run())
    with pytest.raises(EngineError, match="speed must be > 0"):
        ReplayEngine(_trace(), speed=0)
    with pytest.raises(TraceFormatError, match="nope.json"):
        ReplayEngine(tmp_path / "nope.json")


def test_encode_works_on_any_text_for_hand_written_traces(tmp_path: Path) -> None:
    path = _trace().save(tmp_path / "t.json")
    engine = ReplayEngine(path)
    feedback = "Feedback: candidate 3 was 1.42x faster; ünseen wörds ✓."
    assert engine.decode(engine.encode(feedback)) == feedback
    assert engine.encode("First iteration") == _trace().tokenizer().encode("First iteration")
