"""A Hugging Face tokenizer loaded lazily from local files, as the engines need it.

Engines that serve a Hugging Face model (vLLM in-process, an OpenAI-compatible server, replay of a
trace recorded from such a model) tokenize on the client side so fork prompts are exact token ids.
Loading is lazy (transformers costs seconds to import) and offline: nothing is downloaded.
"""
from __future__ import annotations

from typing import Any

from specgen.engines.base import EngineError


class HFTokenizer:
    def __init__(self, path: str, *, engine_name: str) -> None:
        self.path = path
        self._engine_name = engine_name
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            try:
                from transformers import AutoTokenizer
            except ImportError as exc:
                raise EngineError(f"{self._engine_name}: transformers is needed to load tokenizer {self.path!r}") from exc
            try:
                self._tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
            except Exception as exc:
                raise EngineError(
                    f"{self._engine_name}: cannot load tokenizer {self.path!r} from local files ({exc}); "
                    "pass a directory holding tokenizer.json / tokenizer_config.json"
                ) from exc
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def chat_prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        tokenizer = self.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise EngineError(
                f"{self._engine_name}: tokenizer {self.path!r} has no chat template; "
                "add chat_template.jinja to its directory"
            )
        # Render to text, then encode without adding specials: the template already holds them, and
        # this is what servers do, so client-side ids equal the server's.
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.encode(text)

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id])
