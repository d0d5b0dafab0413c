"""The one small interface between specgen and an LLM engine.

Three operations: stream a reasoning generation, fork a non-reasoning generation from exact token
ids, abort. Fork prompts are always built from token ids (prompt ids + reasoning ids so far +
suffix ids) and never by re-tokenizing text, because re-tokenizing breaks the engine's prefix-cache
hash chain and the fork would recompute the whole prefix.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import AsyncIterator

from specgen.errors import SpecgenError


@dataclass
class GenerationParams:
    max_tokens: int = 4096
    temperature: float = 0.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False                  # keep going past end-of-text (benchmarks want exact lengths)


@dataclass
class TokenDelta:
    """New tokens of one generation, as they arrive."""

    token_ids: list[int]
    text: str
    t: float                                  # time.monotonic() when these tokens arrived
    finished: bool = False
    finish_reason: str | None = None          # "stop" | "length" | "abort" | "error"
    # Prompt tokens served from the prefix cache, and the prompt length as the engine saw it. Set on
    # the first delta by engines that know them up front (vLLM in-process, replay); HTTP servers report
    # usage only at the end of a stream, so there they are set on the final delta. None: not reported.
    num_cached_tokens: int | None = None
    num_prompt_tokens: int | None = None


class EngineError(SpecgenError, RuntimeError):
    """The engine failed in a way a job should record (unreachable server, cut stream, ...).

    Raised from `start()` and from inside a running stream (never a silent end or a hang); the message
    names what to fix (the URL, the model name, the file and field, the setting behind a timeout).
    """


class Engine(abc.ABC):
    """An LLM engine. Implementations must allow many concurrent generations (forks)."""

    name: str = "engine"
    think_end: str = "</think>"               # closes the reasoning section of the chat template

    async def start(self) -> None:
        """Bring the engine up (load the model, connect); idempotent."""

    async def close(self) -> None:
        """Release everything; idempotent."""

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without special tokens added."""

    @abc.abstractmethod
    def decode(self, token_ids: list[int]) -> str:
        """Text of `token_ids`."""

    @abc.abstractmethod
    def chat_prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a chat (role/content dicts) with the assistant turn opened for generation."""

    @abc.abstractmethod
    def reason(
        self, request_id: str, prompt_ids: list[int], params: GenerationParams
    ) -> AsyncIterator[TokenDelta]:
        """Stream a reasoning generation."""

    @abc.abstractmethod
    def fork(
        self,
        request_id: str,
        prompt_ids: list[int],
        reasoning_ids: list[int],
        suffix_ids: list[int],
        params: GenerationParams,
    ) -> AsyncIterator[TokenDelta]:
        """Stream a non-reasoning generation whose prompt is prompt + reasoning so far + suffix."""

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None:
        """Stop a generation; its stream ends with finish_reason "abort". Unknown ids are ignored."""
