"""Tokens and timelines: the client's tokenizer as the server needs it, and what an answer streams
(each token's id, where its text ends, when it is due)."""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from specgen.engines.tokenizer_loading import HFTokenizer
from specgen.traces.format import Segment

class ServedTokenizer:
    """The client's tokenizer, as the server needs it: ids with the character each token ends at."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.hf = HFTokenizer(path, engine_name="trace serve")
        self.vocab_size = self.hf.vocab_size      # loads it now: a bad directory fails at start-up

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text) if text else []

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids)

    def encode_with_ends(self, text: str) -> list[tuple[int, int]] | None:
        """(id, end offset in `text`) of each token of `text`, or None without a fast tokenizer."""
        backend = getattr(self.hf.tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        encoding = backend.encode(text, add_special_tokens=False)
        return list(zip(encoding.ids, (end for _, end in encoding.offsets)))

    def prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        try:
            return len(self.hf.chat_prompt_ids(messages))
        except Exception:  # noqa: BLE001 - no chat template: count the text
            return len(self.encode("\n".join(m["content"] for m in messages)))


@dataclass
class Timeline:
    """What one answer streams: token ids, where each token's text ends in `text`, and when it is
    due (seconds from the request's start, recorded pace). Tokens from `answer_from` on are the
    answer (after the reasoning); a fork's answer is all answer."""

    ids: list[int]
    ends: list[int]
    times: list[float]
    text: str
    answer_from: int

    def char_end(self, tokens: int) -> int:
        """Where the text of the first `tokens` tokens ends."""
        return self.ends[tokens - 1] if tokens else 0

    @classmethod
    def join(cls, first: "Timeline", second: "Timeline") -> "Timeline":
        shift = len(first.text)
        return cls(first.ids + second.ids, first.ends + [end + shift for end in second.ends],
                   first.times + second.times, first.text + second.text, len(first.ids))


EMPTY = Timeline([], [], [], "", 0)


def segment_timeline(segment: Segment, tokens: ServedTokenizer, same_ids: bool) -> Timeline:
    """A recorded segment as the served tokenizer's tokens, each due when its text was recorded."""
    ids: list[int] = []
    ends: list[int] = []
    times: list[float] = []
    text = segment.text
    if same_ids:
        offset = 0
        for chunk in segment.chunks:
            for index, token_id in enumerate(chunk.token_ids):
                ids.append(token_id)
                ends.append(offset + (len(chunk.text) if index == len(chunk.token_ids) - 1 else 0))
                times.append(chunk.t)
            offset += len(chunk.text)
        return Timeline(ids, ends, times, text, 0)
    encoded = tokens.encode_with_ends(text)
    if encoded is None:
        # No offsets: each chunk on its own (its ids still decode to its text).
        offset = 0
        for chunk in segment.chunks:
            chunk_ids = tokens.encode(chunk.text)
            for index, token_id in enumerate(chunk_ids):
                ids.append(token_id)
                ends.append(offset + (len(chunk.text) if index == len(chunk_ids) - 1 else 0))
                times.append(chunk.t)
            offset += len(chunk.text)
        return Timeline(ids, ends, times, text, 0)
    starts: list[int] = []
    offset = 0
    for chunk in segment.chunks:
        starts.append(offset)
        offset += len(chunk.text)
    end = 0
    for token_id, token_end in encoded:
        end = max(end, token_end)
        ids.append(token_id)
        ends.append(end)
        # A token is due once its last character had arrived.
        times.append(segment.chunks[max(0, bisect.bisect_right(starts, max(end - 1, 0)) - 1)].t)
    if ends:
        ends[-1] = len(text)
    return Timeline(ids, ends, times, text, 0)


def text_timeline(text: str, tokens: ServedTokenizer, first_s: float, rate: float) -> Timeline:
    """Text with no recorded timing: the first token after `first_s`, then `rate` tokens/s."""
    encoded = tokens.encode_with_ends(text)
    if encoded is None:
        encoded = [(token_id, 0) for token_id in tokens.encode(text)]
    ends, end = [], 0
    for _, token_end in encoded:
        end = max(end, token_end)
        ends.append(end)
    if ends:
        ends[-1] = len(text)
    times = [first_s + index / rate for index in range(len(encoded))]
    return Timeline([token_id for token_id, _ in encoded], ends, times, text, 0)
