"""A deterministic tokenizer for hand-written traces, whose vocabulary travels inside the trace.

Hand-written traces have no model and so no model tokenizer, yet the replay engine must `encode`
arbitrary text (feedback prompts, fork suffixes) and `decode` what it streams. This tokenizer needs
no download and no training:

- text is split into pre-tokens (a word with its leading space, a run of digits, a run of
  punctuation, a run of whitespace; the chat markers and think tags whole), and each pre-token into
  pieces of at most `MAX_PIECE_CHARS` characters, which makes token counts close to a real BPE
  tokenizer's (about 4 characters a token) so durations taken from a token rate look realistic;
- a piece in the vocabulary is one token; any other piece becomes its UTF-8 bytes, one token each,
  so every text encodes, and `decode(encode(text)) == text` always holds.

Ids: the special tokens first, then the 256 bytes, then the vocabulary in order. The vocabulary
grows when a trace is built (`encode(text, extend=True)`), and the trace stores it, so ids stay
stable once written.
"""
from __future__ import annotations

import re

TOKENIZER_KIND = "specgen-pieces-v1"
MAX_PIECE_CHARS = 4

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
THINK_START = "<think>"
THINK_END = "</think>"
_BYTE_BASE = len(SPECIAL_TOKENS)
_VOCAB_BASE = _BYTE_BASE + 256

_PRE_TOKEN = re.compile(
    "|".join(re.escape(token) for token in SPECIAL_TOKENS)
    + r"| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|_+|\s+(?!\S)|\s"
)


def split_pieces(text: str) -> list[str]:
    """The pieces `text` is tokenized into, before the vocabulary look-up."""
    pieces: list[str] = []
    position = 0
    for match in _PRE_TOKEN.finditer(text):
        if match.start() > position:  # anything the pattern skipped stays, as its own pre-token
            pieces.extend(_chop(text[position:match.start()]))
        pre_token = match.group()
        if pre_token in SPECIAL_TOKENS:
            pieces.append(pre_token)
        else:
            pieces.extend(_chop(pre_token))
        position = match.end()
    if position < len(text):
        pieces.extend(_chop(text[position:]))
    return pieces


def _chop(pre_token: str) -> list[str]:
    return [pre_token[i:i + MAX_PIECE_CHARS] for i in range(0, len(pre_token), MAX_PIECE_CHARS)]


class PieceTokenizer:
    """Encode/decode with a piece vocabulary; see the module docstring."""

    kind = TOKENIZER_KIND

    def __init__(self, vocab: list[str] | None = None) -> None:
        self._pieces: list[str] = []
        self._ids: dict[str, int] = {}
        for piece in vocab or []:
            self._add(piece)

    def _add(self, piece: str) -> int:
        if not isinstance(piece, str) or not piece:
            raise ValueError(f"vocabulary entry {piece!r} is not a non-empty string")
        if piece in self._ids or piece in SPECIAL_TOKENS:
            raise ValueError(f"vocabulary entry {piece!r} appears twice or is a special token")
        token_id = _VOCAB_BASE + len(self._pieces)
        self._pieces.append(piece)
        self._ids[piece] = token_id
        return token_id

    @property
    def vocab(self) -> list[str]:
        return list(self._pieces)

    @property
    def vocab_size(self) -> int:
        return _VOCAB_BASE + len(self._pieces)

    def special_id(self, token: str) -> int:
        return SPECIAL_TOKENS.index(token)

    def encode(self, text: str, *, extend: bool = False) -> list[int]:
        """Token ids of `text`; with `extend`, unknown pieces join the vocabulary instead of bytes."""
        ids: list[int] = []
        for piece in split_pieces(text):
            if piece in SPECIAL_TOKENS:
                ids.append(SPECIAL_TOKENS.index(piece))
            elif piece in self._ids:
                ids.append(self._ids[piece])
            elif extend:
                ids.append(self._add(piece))
            else:
                ids.extend(_BYTE_BASE + b for b in piece.encode("utf-8"))
        return ids

    def decode(self, token_ids: list[int]) -> str:
        parts: list[str] = []
        pending = bytearray()
        for token_id in token_ids:
            if _BYTE_BASE <= token_id < _VOCAB_BASE:
                pending.append(token_id - _BYTE_BASE)
                continue
            if pending:
                parts.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
            parts.append(self.token_text(token_id))
        if pending:
            parts.append(pending.decode("utf-8", errors="replace"))
        return "".join(parts)

    def token_text(self, token_id: int) -> str:
        if 0 <= token_id < _BYTE_BASE:
            return SPECIAL_TOKENS[token_id]
        if _BYTE_BASE <= token_id < _VOCAB_BASE:
            return bytes([token_id - _BYTE_BASE]).decode("utf-8", errors="replace")
        index = token_id - _VOCAB_BASE
        if 0 <= index < len(self._pieces):
            return self._pieces[index]
        raise ValueError(f"token id {token_id} is outside this tokenizer's vocabulary (size {self.vocab_size})")

    def chat_prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Qwen-style chat markup with the assistant turn opened in reasoning, like reasoning models."""
        return self.encode(render_chat(messages))


def render_chat(messages: list[dict[str, str]]) -> str:
    parts = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not isinstance(
            message.get("content"), str
        ):
            raise ValueError(f"messages[{index}] must be a dict with string 'role' and 'content'")
        parts.append(f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n")
    parts.append(f"<|im_start|>assistant\n{THINK_START}\n")
    return "".join(parts)
