"""Fork models: what a fork of replayed reasoning writes (`--fork-model`, written into results).

A replayed trace holds the reasoning and the final answer, never what a fork at an arbitrary
position would have written; each model here is one honest answer to that, with its premise:

- `draft` (the conservative bound): the latest complete `ModelNew` program the reasoning itself
  drafted before the fork position, fenced or not, found by the project's own extraction
  (`extraction.find_drafts`); nothing after the position is read; with no draft there, the fork
  writes nothing.
- `named` (an optimistic bound, never a headline): from the point where the final answer's kernel
  is first named in the reasoning (a `__global__` or `@triton.jit` function name of the answer),
  the fork writes the final answer's program; before it, what `draft` writes. It reads the
  answer, i.e. the future: it bounds what forks could do, it does not measure it.
- `model`: a real engine (vLLM in-process, or an OpenAI-compatible server) writes the fork from the
  actual fork prompt (the conversation, the reasoning so far, the fork suffix): closed loop; what
  comes back depends on the prompt and its feedback.
"""
from __future__ import annotations

import uuid
from typing import Any

from specgen.engines.base import Engine, GenerationParams
from specgen.engines.trace import Iteration
from specgen.optimize.extraction import extract_candidate, find_drafts, first_naming

FORK_MODELS = ("draft", "named", "model")


def latest_draft(text: str) -> str | None:
    """The last complete `ModelNew` program in `text` (a closed fenced block or an unfenced
    draft), or None. A fork's prompt closes the reasoning at the fork position with the think-end
    tag, so the end of `text` ends a draft there, as the end of the reasoning does for the loop."""
    drafts = find_drafts(text, ended=True)
    return drafts[-1].source.strip("\n") + "\n" if drafts else None


def as_answer(program: str) -> str:
    return f"```python\n{program}```\n"


class DraftWriter:
    name = "draft"

    async def write(self, iteration: Iteration, position: int, reasoning_text: str,
                    suffix_text: str) -> str:
        draft = latest_draft(reasoning_text)        # the reasoning up to the fork, nothing more
        return as_answer(draft) if draft else ""


class NamedWriter:
    name = "named"

    def __init__(self) -> None:
        self._answers: dict[int, tuple[str | None, int | None]] = {}

    def _answer(self, iteration: Iteration) -> tuple[str | None, int | None]:
        key = id(iteration)
        if key not in self._answers:
            final = extract_candidate(iteration.final.text, accept_unclosed=True)
            named = first_naming(iteration.reasoning.text, final) if final else None
            self._answers[key] = (final, named)
        return self._answers[key]

    async def write(self, iteration: Iteration, position: int, reasoning_text: str,
                    suffix_text: str) -> str:
        final, named = self._answer(iteration)
        if final is not None and named is not None and len(reasoning_text) > named:
            return as_answer(final)
        draft = latest_draft(reasoning_text)
        return as_answer(draft) if draft else ""


class EngineWriter:
    """Forks written by a live engine from the fork prompt, re-tokenized for that engine (its
    tokenizer is not the trace's); the modelled engine paces the delivery."""

    name = "model"

    def __init__(self, engine: Engine, messages: list[dict[str, str]] | None = None,
                 max_tokens: int = 2048) -> None:
        self.engine = engine
        self.messages = messages
        self.max_tokens = max_tokens
        self.calls = 0

    async def write(self, iteration: Iteration, position: int, reasoning_text: str,
                    suffix_text: str) -> str:
        messages = self.messages or iteration.messages or [{"role": "user", "content": ""}]
        prompt_ids = self.engine.chat_prompt_ids(messages)
        self.calls += 1
        parts: list[str] = []
        async for delta in self.engine.fork(f"fork-model-{uuid.uuid4().hex[:12]}", prompt_ids,
                                            self.engine.encode(reasoning_text),
                                            self.engine.encode(suffix_text),
                                            GenerationParams(max_tokens=self.max_tokens)):
            parts.append(delta.text)
        return "".join(parts)


def fork_writer(name: str, engine: Engine | None = None, **options: Any):
    """The writer for `--fork-model NAME` (`model` needs a live engine)."""
    if name == "draft":
        return DraftWriter()
    if name == "named":
        return NamedWriter()
    if name == "model":
        if engine is None:
            raise ValueError("fork model 'model' needs a live engine (--llm vllm|openai)")
        return EngineWriter(engine, **options)
    raise ValueError(f"unknown fork model {name!r}: one of {', '.join(FORK_MODELS)}")
