"""Fork prompts built from exact token ids.

A fork's prompt is the reasoning request's prompt ids + the reasoning ids generated so far + a fixed
suffix (the engine's closing think tag and an instruction to write the final code now). The ids of
the first two parts are the very ids the engine already holds in its KV cache, so the fork's
prefill reuses them; re-tokenizing the reasoning text could split tokens differently and break the
prefix-cache hash chain. The suffix is tokenized once per engine and reused by every fork.

The suffix ends inside an opened ```python fence: the fork starts writing code at its first token
and stops at the closing fence, so forks are short.
"""
from __future__ import annotations

from specgen.engines.base import Engine

# Written as the start of the model's answer, right after its reasoning is closed.
FORK_INSTRUCTION = (
    "\n\nI have to give my answer now, with what I have worked out so far. Here is the complete "
    "program: imports, kernels, and `class ModelNew` with the same interface as `Model`.\n\n"
    "```python\n"
)
# A fork is done when it closes the fence the suffix opened.
FORK_STOP = ["\n```"]


class ForkPromptBuilder:
    """Makes fork prompts for one engine; the suffix ids are computed on first use, then cached."""

    def __init__(self, engine: Engine, instruction: str = FORK_INSTRUCTION) -> None:
        self._engine = engine
        self._instruction = instruction
        self._suffix_ids: list[int] | None = None

    @property
    def opens_fence(self) -> bool:
        """True when the suffix leaves a code fence open, so fork text starts with code."""
        return self._instruction.rstrip(" ").endswith(("```python\n", "```py\n", "```\n"))

    def suffix_text(self) -> str:
        # The reasoning may stop mid-line; the think tag goes on a line of its own.
        return "\n" + self._engine.think_end + self._instruction

    def suffix_ids(self) -> list[int]:
        if self._suffix_ids is None:
            self._suffix_ids = list(self._engine.encode(self.suffix_text()))
        return self._suffix_ids

    def prompt_ids(self, prompt_ids: list[int], reasoning_ids: list[int]) -> list[int]:
        """The whole fork prompt, as one list (for engines or logs that want it joined)."""
        return [*prompt_ids, *reasoning_ids, *self.suffix_ids()]
