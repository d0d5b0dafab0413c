"""The part every backend that serves a real tokenizer shares: token methods and the checks on
`reason`/`fork` arguments, which end in one `_stream(request_id, kind, prompt_ids, params)`."""
from __future__ import annotations

import abc
from typing import AsyncIterator

from specgen.engines.base import Engine, GenerationParams, TokenDelta
from specgen.engines.request_tracking import check_fork_args, check_params, check_prompt_ids
from specgen.engines.tokenizer_loading import HFTokenizer


class TokenizedEngine(Engine):
    """An engine whose prompts are a Hugging Face tokenizer's ids (vLLM in-process, HTTP servers)."""

    _tokenizer: HFTokenizer

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text)

    def decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids)

    def chat_prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return self._tokenizer.chat_prompt_ids(messages)

    def reason(self, request_id: str, prompt_ids: list[int], params: GenerationParams) -> AsyncIterator[TokenDelta]:
        check_prompt_ids(self.name, "prompt_ids", prompt_ids)
        check_params(self.name, params)
        return self._stream(request_id, "reason", list(prompt_ids), params)

    def fork(
        self,
        request_id: str,
        prompt_ids: list[int],
        reasoning_ids: list[int],
        suffix_ids: list[int],
        params: GenerationParams,
    ) -> AsyncIterator[TokenDelta]:
        check_fork_args(self.name, prompt_ids, reasoning_ids, suffix_ids, params)
        # Concatenated ids, never re-tokenized text: the fork's prefix must hash like the stream's.
        return self._stream(request_id, "fork", [*prompt_ids, *reasoning_ids, *suffix_ids], params)

    @abc.abstractmethod
    def _stream(self, request_id: str, kind: str, prompt_ids: list[int],
                params: GenerationParams) -> AsyncIterator[TokenDelta]:
        """Stream one generation of `prompt_ids` (`kind` is "reason" or "fork")."""
