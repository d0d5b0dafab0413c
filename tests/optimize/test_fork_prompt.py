from __future__ import annotations

from specgen.optimize.fork_prompt import FORK_INSTRUCTION, ForkPromptBuilder
from specgen.traces.bundled import bundled_trace
from specgen.traces.replay import ReplayEngine


class CountingReplay(ReplayEngine):
    """The bundled trace's engine, counting how often the suffix is tokenized."""

    encodes = 0

    def encode(self, text: str) -> list[int]:
        self.encodes += 1
        return super().encode(text)


def test_fork_prompt_is_exact_ids_with_a_suffix_tokenized_once() -> None:
    engine = CountingReplay(bundled_trace("fused_elementwise"))
    builder = ForkPromptBuilder(engine)
    prompt = engine.chat_prompt_ids([{"role": "user", "content": "make it fast"}])
    reasoning = engine.trace.iterations[0].reasoning.token_ids[:300]
    first = builder.prompt_ids(prompt, reasoning)
    second = builder.prompt_ids(prompt, reasoning[:100])
    assert engine.encodes == 1
    suffix = builder.suffix_ids()
    assert first == prompt + reasoning + suffix and second == prompt + reasoning[:100] + suffix
    # The suffix closes the reasoning and opens the code fence the fork writes into.
    text = engine.decode(suffix)
    assert text == "\n" + engine.think_end + FORK_INSTRUCTION
    assert text.endswith("```python\n") and builder.opens_fence
    # The reasoning ids are used as they are, never re-tokenized from text.
    assert first[len(prompt):len(prompt) + 300] == reasoning


def test_an_instruction_without_a_fence() -> None:
    engine = ReplayEngine(bundled_trace("fused_elementwise"))
    builder = ForkPromptBuilder(engine, instruction="\n\nWrite the final program now.\n")
    assert not builder.opens_fence
    assert engine.decode(builder.suffix_ids()).endswith("Write the final program now.\n")
