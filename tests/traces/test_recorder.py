from __future__ import annotations

from pathlib import Path

import pytest

from specgen.engines.base import GenerationParams
from specgen.traces.format import Trace, TraceBuilder
from specgen.traces.recorder import RecordingPlan, record_trace
from specgen.traces.replay import ReplayEngine

MESSAGES = [{"role": "user", "content": "Make ReLU fast."}]


def _hand_written() -> Trace:
    builder = TraceBuilder(token_rate=800.0, problem="level1/19_ReLU", ttft_s=0.02, fork_ttft_s=0.01)
    builder.add_iteration(
        "Reading the reference. " * 8 + "KERNEL_A. " + "Refining the block size. " * 8,
        forks={"KERNEL_A.": "code A", 120: "code B"},
        final_text="final A",
    )
    builder.add_iteration("Feedback: 1.2x. Use more warps. " * 6, forks={20: "code C"}, final_text="final C")
    return builder.build()


def test_recording_a_replay_reproduces_the_trace(loop, tmp_path: Path) -> None:
    source = _hand_written()
    seen_feedback: list[str] = []

    def next_messages(index: int, messages: list[dict[str, str]], final_text: str) -> list[dict[str, str]]:
        seen_feedback.append(final_text)
        return [*messages, {"role": "assistant", "content": final_text}, {"role": "user", "content": "faster"}]

    plan = RecordingPlan(fork_every=0, fork_positions=(10, 60, 125, 400), iterations=2)
    recorded = loop.run(record_trace(
        ReplayEngine(source), MESSAGES, problem="level1/19_ReLU", model="replay of a hand-written trace",
        plan=plan, next_messages=next_messages,
    ))
    path = recorded.save(tmp_path / "recorded.json")
    loaded = Trace.load(path)
    assert loaded.metadata.hand_written is False and loaded.metadata.token_rate is None
    assert loaded.metadata.tokenizer == source.metadata.tokenizer and loaded.vocab == source.vocab
    for got, want in zip(loaded.iterations, source.iterations):
        # The think-end tag splits reasoning from the final answer exactly where the source did.
        assert got.reasoning.token_ids == want.reasoning.token_ids
        assert got.final.text == want.final.text
        for fork in got.forks:
            expected = want.fork_at(fork.position)
            assert fork.completion.text == (expected.completion.text if expected else "")
        # Recorded timing follows the source's (same engine clock, small scheduling slack).
        assert got.reasoning.duration_s == pytest.approx(want.reasoning.duration_s, abs=0.1)
    first_positions = [fork.position for fork in loaded.iterations[0].forks]
    assert first_positions == [10, 60, 125]          # 400 lies past the end of the reasoning
    assert seen_feedback == [source.iterations[0].final.text]
    assert loaded.iterations[1].messages[-1] == {"role": "user", "content": "faster"}


@pytest.mark.vllm
def test_recording_a_live_vllm_engine(loop, tiny_vllm_engine, tmp_path: Path) -> None:
    engine = tiny_vllm_engine
    plan = RecordingPlan(
        fork_every=64, iterations=2,
        reasoning=GenerationParams(max_tokens=256), fork=GenerationParams(max_tokens=24),
    )
    recorded = loop.run(record_trace(engine, MESSAGES, problem="p", model="tiny-qwen2", plan=plan), timeout_s=300)
    loaded = Trace.load(recorded.save(tmp_path / "live.json"))
    assert loaded.metadata.tokenizer == {"kind": "huggingface", "name_or_path": engine._tokenizer.path}
    assert len(loaded.iterations) == 2
    first = loaded.iterations[0]
    assert first.reasoning.num_tokens == 256
    assert [fork.position for fork in first.forks] == [64, 128, 192, 256]
    for fork in first.forks:
        times = [chunk.t for chunk in fork.completion.chunks]
        assert fork.completion.num_tokens == 24 and times == sorted(times) and times[0] > 0
    # The second iteration's prompt carries the first answer back (default feedback).
    assert loaded.iterations[1].messages[1]["role"] == "assistant"
    prompt = engine.chat_prompt_ids(MESSAGES)
    suffix = engine.encode(plan.suffix_text)

    async def check() -> None:
        # Recorded with exact ids: a fresh fork at a recorded position reproduces the completion.
        fork = first.forks[1]
        fresh = [t async for d in engine.fork("rec-check", prompt, first.reasoning.token_ids[: fork.position], suffix,
                                               GenerationParams(max_tokens=24)) for t in d.token_ids]
        assert fresh == fork.completion.token_ids
        # And the trace replays what the engine produced.
        replay = ReplayEngine(loaded, speed=float("inf"))
        replayed = [t async for d in replay.reason("r", prompt, GenerationParams(max_tokens=10_000)) for t in d.token_ids]
        assert replayed == first.reasoning.token_ids + first.final.token_ids
        assert replay.decode(replayed) == first.reasoning.text + first.final.text

    loop.run(check(), timeout_s=120)
