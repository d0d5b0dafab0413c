from __future__ import annotations

import asyncio

from specgen.engines.base import GenerationParams
from specgen.traces.format import TraceBuilder
from specgen.traces.pinned_replay import IterationReplayEngine


def three_iterations():
    builder = TraceBuilder(token_rate=1000, problem="p", ttft_s=0.0)
    for name in ("first", "second", "third"):
        builder.add_iteration(f"thinking about the {name} idea", forks={},
                              final_text=f"answer {name}")
    return builder.build()


async def reasoning_text(engine: IterationReplayEngine, request_id: str) -> str:
    text = ""
    async for delta in engine.reason(request_id, [1, 2, 3], GenerationParams(max_tokens=100)):
        text += delta.text
    return text


def test_pinned_iteration_serves_every_stream_the_same_recording() -> None:
    engine = IterationReplayEngine(three_iterations(), speed=float("inf"))

    async def go() -> list[str]:
        engine.pin_iteration(1)
        pinned = await asyncio.gather(*(reasoning_text(engine, f"r{i}") for i in range(3)))
        engine.pin_iteration(5)                     # past the end: the last one is repeated
        beyond = await reasoning_text(engine, "r3")
        engine.pin_iteration(None)                  # call order again: this is call 4 -> last
        unpinned = await reasoning_text(engine, "r4")
        return [*pinned, beyond, unpinned]

    texts = asyncio.run(go())
    assert all("second idea" in t for t in texts[:3])
    assert "third idea" in texts[3] and "third idea" in texts[4]


def test_unpinned_engine_follows_call_order() -> None:
    engine = IterationReplayEngine(three_iterations(), speed=float("inf"))

    async def go() -> list[str]:
        return [await reasoning_text(engine, f"r{i}") for i in range(2)]

    first, second = asyncio.run(go())
    assert "first idea" in first and "second idea" in second
