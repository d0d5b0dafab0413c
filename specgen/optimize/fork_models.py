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

**Adding one** is a module with a writer class and one `register_fork_model(...)` line (see
docs/optimize.md, "Adding a fork model"). Everything that offers a fork model (`specgen bench
--fork-model`, `specgen optimize --fork-model`, the simulator's scripted turns, the virtual
clock) reads this registry. A writer that reads only the trace implements `program_at`, which
lets the virtual clock script it; one that needs a live engine (`needs_engine`) runs on the wall
clock only. A module outside specgen is a plug-in, named to every process by `runtime/plugins.py`.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Callable

from specgen.engines.base import Engine, GenerationParams
from specgen.traces.extraction import extract_candidate, find_drafts, first_naming
from specgen.traces.format import Iteration

def latest_draft(text: str) -> str | None:
    """The last complete `ModelNew` program in `text` (a closed fenced block or an unfenced
    draft), or None. A fork's prompt closes the reasoning at the fork position with the think-end
    tag, so the end of `text` ends a draft there, as the end of the reasoning does for the loop."""
    drafts = find_drafts(text, ended=True)
    return drafts[-1].source.strip("\n") + "\n" if drafts else None


def as_answer(program: str) -> str:
    return f"```python\n{program}```\n"


class ReplayWriter:
    """A writer that reads only the trace: what it writes at a position is `program_at`, which
    the virtual clock asks directly and `write` wraps as the fork's answer text."""

    name = ""

    def __init__(self) -> None:
        self._finals: dict[int, str | None] = {}

    def program_at(self, reasoning_so_far: str, reasoning: str, final: str | None) -> str | None:
        """The program a fork writes after `reasoning_so_far` (a prefix of the turn's
        `reasoning`, whose final answer's program is `final`), or None for nothing."""
        raise NotImplementedError

    async def write(self, iteration: Iteration, position: int, reasoning_text: str,
                    suffix_text: str) -> str:
        if id(iteration) not in self._finals:        # once per turn, not once per fork
            self._finals[id(iteration)] = extract_candidate(iteration.final.text, accept_unclosed=True)
        program = self.program_at(reasoning_text, iteration.reasoning.text, self._finals[id(iteration)])
        return as_answer(program) if program else ""


class DraftWriter(ReplayWriter):
    name = "draft"

    def program_at(self, reasoning_so_far: str, reasoning: str, final: str | None) -> str | None:
        return latest_draft(reasoning_so_far)       # the reasoning up to the fork, nothing more


class NamedWriter(ReplayWriter):
    name = "named"

    def __init__(self) -> None:
        super().__init__()
        self._named: dict[tuple[int, int], int | None] = {}

    def program_at(self, reasoning_so_far: str, reasoning: str, final: str | None) -> str | None:
        if final is not None:
            key = (hash(reasoning), hash(final))      # one search per turn, not per fork
            if key not in self._named:
                self._named[key] = first_naming(reasoning, final)
            named = self._named[key]
            if named is not None and len(reasoning_so_far) > named:
                return final
        return latest_draft(reasoning_so_far)


class EngineWriter:
    """Forks written by a live engine from the fork prompt, re-tokenized for that engine (its
    tokenizer is not the trace's); the modelled engine paces the delivery. The prompt is the
    replayed iteration's own messages; `messages` stands in where it recorded none (a generated
    trace): without them the engine would write from the reasoning alone, never having seen the
    problem."""

    name = "model"

    def __init__(self, engine: Engine, messages: list[dict[str, str]] | None = None,
                 max_tokens: int = 2048) -> None:
        self.engine = engine
        self.messages = messages
        self.max_tokens = max_tokens
        self.calls = 0

    async def write(self, iteration: Iteration, position: int, reasoning_text: str,
                    suffix_text: str) -> str:
        messages = iteration.messages or self.messages or [{"role": "user", "content": ""}]
        prompt_ids = self.engine.chat_prompt_ids(messages)
        self.calls += 1
        parts: list[str] = []
        async for delta in self.engine.fork(f"fork-model-{uuid.uuid4().hex[:12]}", prompt_ids,
                                            self.engine.encode(reasoning_text),
                                            self.engine.encode(suffix_text),
                                            GenerationParams(max_tokens=self.max_tokens)):
            parts.append(delta.text)
        return "".join(parts)


@dataclass(frozen=True)
class ForkModel:
    """A registered fork model: `make(engine, **options)` builds its writer."""

    name: str
    make: Callable[..., Any]
    needs_engine: bool = False          # written by a live engine: the wall clock only
    summary: str = ""

    @property
    def replays(self) -> bool:
        """Whether the virtual clock can script it (it reads only the trace)."""
        return not self.needs_engine


FORK_MODELS: dict[str, ForkModel] = {}


def register_fork_model(name: str, make: Callable[..., Any], *, needs_engine: bool = False,
                        summary: str = "") -> ForkModel:
    """Offer a fork model under `name` to every command; `make(engine, **options)` returns the
    writer (a `ReplayWriter`, or an object with `async write(...)` when it needs an engine)."""
    if name in FORK_MODELS or name == "scripted":
        raise ValueError(f"fork model {name!r} is already registered")
    FORK_MODELS[name] = model = ForkModel(name, make, needs_engine, summary)
    return model


def replayable_fork_models() -> tuple[str, ...]:
    """The fork models the virtual clock and a replayed `optimize` can run (no live engine)."""
    return tuple(n for n, m in FORK_MODELS.items() if m.replays)


def fork_writer(name: str, engine: Engine | None = None, **options: Any):
    """The writer for `--fork-model NAME` (one that needs an engine gets `engine`)."""
    model = FORK_MODELS.get(name)
    if model is None:
        from specgen.runtime.plugins import unknown_name_hint

        raise ValueError(f"unknown fork model {name!r}: one of {', '.join(FORK_MODELS)} ({unknown_name_hint()})")
    if model.needs_engine:
        if engine is None:
            raise ValueError(f"fork model {name!r} needs a live engine (--llm vllm|openai)")
        return model.make(engine, **options)
    return model.make(None, **options)


register_fork_model("draft", lambda engine: DraftWriter(),
                    summary="the latest complete draft before the fork (the conservative bound)")
register_fork_model("named", lambda engine: NamedWriter(),
                    summary="the final answer once its kernel is named (an optimistic bound)")
register_fork_model("model", lambda engine, **options: EngineWriter(engine, **options),
                    needs_engine=True, summary="a live engine writes the fork from its prompt")
