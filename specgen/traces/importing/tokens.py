"""A turn's text as trace tokens and chunks: a piece vocabulary built from the trace's own
text (`Pieces`) or a local Hugging Face tokenizer (`HFTokens`), and a segment's chunks timed by
their arrival times or by a token rate (`segment`).
"""
from __future__ import annotations

from typing import Any

from specgen.engines.base import EngineError
from specgen.traces.format import HUGGINGFACE_KIND, Chunk, Segment
from specgen.traces.importing.turns import Timeline, TraceImportError
from specgen.traces.tokenizer import SPECIAL_TOKENS, PieceTokenizer, split_pieces
from specgen.traces.tokenizer import TOKENIZER_KIND as PIECES_KIND

CHARS_PER_TOKEN = 3.6            # real BPE tokenizers on English reasoning with code
_MAX_JOINED_CHARS = 10           # a joined piece stays word-sized
_MAX_JOINED_SPACE = 16           # runs of indentation join further


class Pieces:
    """A piece vocabulary for one trace, from its own text: pieces of the project's piece tokenizer,
    joined (within a word, or runs of white space) to about CHARS_PER_TOKEN characters a token."""

    kind = PIECES_KIND

    def __init__(self) -> None:
        self.vocab: list[str] = []
        self._ids: dict[str, int] = {}
        self._base = PieceTokenizer().vocab_size
        self._special = {token: index for index, token in enumerate(SPECIAL_TOKENS)}

    def spec(self) -> dict[str, str]:
        return {"kind": PIECES_KIND}

    def tokens(self, text: str) -> tuple[list[int], list[int]]:
        joined: list[str] = []
        chars = 0
        special = self._special
        for piece in split_pieces(text):
            if joined and chars < CHARS_PER_TOKEN * len(joined) and piece not in special \
                    and joined[-1] not in special:
                last = joined[-1]
                both_space = piece.isspace() and last.isspace()
                width = len(last) + len(piece)
                if (both_space and width <= _MAX_JOINED_SPACE) or (
                        not piece[0].isspace() and not last.isspace() and width <= _MAX_JOINED_CHARS):
                    joined[-1] = last + piece
                    chars += len(piece)
                    continue
            joined.append(piece)
            chars += len(piece)
        ids: list[int] = []
        ends: list[int] = []
        offset = 0
        table = self._ids
        for piece in joined:
            token_id = special.get(piece)
            if token_id is None:
                token_id = table.get(piece)
                if token_id is None:
                    token_id = self._base + len(self.vocab)
                    self.vocab.append(piece)
                    table[piece] = token_id
            offset += len(piece)
            ids.append(token_id)
            ends.append(offset)
        return ids, ends


class HFTokens:
    kind = HUGGINGFACE_KIND

    def __init__(self, path: str) -> None:
        from specgen.engines.tokenizer_loading import HFTokenizer

        self.path = path
        self.vocab = None
        try:
            self._tokenizer = HFTokenizer(path, engine_name="trace import").tokenizer
        except EngineError as exc:
            raise TraceImportError(f"--tokenizer {path}: {exc}") from None

    def spec(self) -> dict[str, str]:
        return {"kind": HUGGINGFACE_KIND, "name_or_path": self.path}

    def tokens(self, text: str) -> tuple[list[int], list[int]]:
        tokenizer = self._tokenizer
        if getattr(tokenizer, "is_fast", False):
            encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
            ids = list(encoded["input_ids"])
            ends = [end for _, end in encoded["offset_mapping"]]
        else:                      # no offsets: decode each token with a little context
            ids = list(tokenizer.encode(text, add_special_tokens=False))
            ends, offset = [], 0
            for index in range(len(ids)):
                context = max(0, index - 4)
                before = tokenizer.decode(ids[context:index])
                after = tokenizer.decode(ids[context:index + 1])
                piece = after[len(before):] if after.startswith(before) else ""
                offset = min(len(text), offset + len(piece.rstrip("\ufffd")))
                ends.append(offset)
        running = 0
        for index, end in enumerate(ends):
            running = min(len(text), max(running, end))
            ends[index] = running
        if ends:
            ends[-1] = len(text)
        return ids, ends


def segment(text: str, tokens: Any, start_index: int, timing: Timeline | None, rate: float | None,
            ttft_s: float) -> Segment:
    if not text:
        return Segment([])
    ids, ends = tokens.tokens(text)
    count = len(ids)
    if timing is not None:
        time_at = timing.time_at
        times = [time_at(max(0, end - 1)) for end in ends]
    else:
        assert rate is not None
        times = [ttft_s + (start_index + index) / rate for index in range(count)]
    recorded = timing is not None
    starts = [0, *ends[:-1]]
    if not recorded and all(map(int.__lt__, starts, ends)):
        # Every token ends in a character of its own (piece tokens always): one chunk a token.
        return Segment([Chunk(t, [token_id], text[begin:end])
                        for t, token_id, begin, end in zip(times, ids, starts, ends)])
    chunks: list[Chunk] = []
    pending: list[int] = []
    begin = 0
    for index in range(count):
        pending.append(ids[index])
        end = ends[index]
        if index + 1 < count:
            if ends[index + 1] <= end:
                continue              # the next token ends in the same character: it completes it
            if recorded and times[index + 1] == times[index]:
                continue              # tokens that arrived together stay one chunk, as streamed
        chunks.append(Chunk(t=times[index], token_ids=pending, text=text[begin:end]))
        pending = []
        begin = end
    return Segment(chunks)
