"""Recorded reasoning traces: the file format, strict loading, and a builder for hand-written ones.

A trace is one JSON file (format "specgen-trace", version 1) for one problem:

    {
      "format": "specgen-trace", "version": 1,
      "metadata": {
        "model": "...",                       # the model that produced it, or "hand-written"
        "tokenizer": {"kind": "specgen-pieces-v1"} | {"kind": "huggingface", "name_or_path": "..."},
        "hand_written": true,                 # written by a person, not recorded from a model
        "token_rate": 40.0,                   # tokens/s the timing was derived from (hand-written only)
        "problem": "level1/19_ReLU",
        "notes": "...",
        "think_end": "</think>",              # the tag that closes reasoning
        "created": "2026-01-01T00:00:00Z",
        "timing": "recorded" | "rate",        # optional (imported traces): real arrival times or token_rate
        "imported_from": ["log.jsonl"]        # optional (imported traces): the files it was made from
      },
      "vocab": ["Let", " me", ...],           # the piece vocabulary (specgen-pieces-v1 only)
      "iterations": [{
        "record": {"id": "req-17", "file": "log.jsonl", "line": 12},  # optional (imported traces):
                                                     # the input record of this turn (id when it had one)
        "messages": [{"role": "user", "content": "..."}],   # optional: the chat this answered
        "reasoning": {"chunks": [[t, [ids], "text"], ...]},  # t: seconds since the request began
        "final":     {"chunks": [...]},                      # from the think_end tag to the end
        "forks": [{"position": 512,                          # reasoning tokens before the fork
                   "suffix_text": "</think> ...",            # what the fork prompt appended
                   "completion": {"chunks": [...]}}]         # t: seconds since the fork began
      }]
    }

A chunk is what one engine step streamed: a timestamp, the token ids, and their text (the texts of a
segment concatenate to its text). Loading checks every field and names the file and the field in
its error; a trace is data from outside, and replaying a malformed one would fail far from the cause.
"""
from __future__ import annotations

import datetime as _datetime
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from specgen.engines.base import EngineError
from specgen.errors import UsageError
from specgen.traces.tokenizer import PieceTokenizer
from specgen.traces.tokenizer import TOKENIZER_KIND as PIECES_KIND

TRACE_FORMAT = "specgen-trace"
TRACE_VERSION = 1
HUGGINGFACE_KIND = "huggingface"
DEFAULT_FORK_SUFFIX = "</think>\n\nI will now write the final, complete ModelNew code.\n"


class TraceFormatError(EngineError, UsageError):
    """A trace file that cannot be used; the message names the file and the field."""


# -- data ------------------------------------------------------------------------------------------


@dataclass
class Chunk:
    t: float                     # seconds since the request began
    token_ids: list[int]
    text: str


@dataclass
class Segment:
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def token_ids(self) -> list[int]:
        return [token_id for chunk in self.chunks for token_id in chunk.token_ids]

    @property
    def text(self) -> str:
        return "".join(chunk.text for chunk in self.chunks)

    @property
    def num_tokens(self) -> int:
        return sum(len(chunk.token_ids) for chunk in self.chunks)

    @property
    def duration_s(self) -> float:
        return self.chunks[-1].t if self.chunks else 0.0


@dataclass
class ForkRecording:
    position: int                # reasoning tokens the fork's prompt held
    completion: Segment
    suffix_text: str = ""


@dataclass
class SourceRecord:
    """Where an imported turn came from: the input file and line of its record, and the record's
    own id (`custom_id`, `id`) when it had one, so a trace can be traced back to its record."""
    file: str
    line: int
    id: str | None = None


@dataclass
class Iteration:
    reasoning: Segment
    final: Segment
    forks: list[ForkRecording] = field(default_factory=list)   # sorted by position
    messages: list[dict[str, str]] | None = None
    record: SourceRecord | None = None    # imported traces: the input record this turn came from

    def fork_at(self, position: int) -> ForkRecording | None:
        """The recording at `position` or, if none, the nearest earlier one; None before the first."""
        chosen: ForkRecording | None = None
        for fork in self.forks:
            if fork.position > position:
                break
            chosen = fork
        return chosen


@dataclass
class TraceMetadata:
    model: str
    tokenizer: dict[str, str]
    hand_written: bool
    problem: str
    token_rate: float | None = None
    notes: str = ""
    think_end: str = "</think>"
    created: str = ""
    timing: str = ""                                         # "recorded" | "rate"; "" when unstated
    imported_from: list[str] = field(default_factory=list)   # source files of an imported trace


@dataclass
class Trace:
    metadata: TraceMetadata
    iterations: list[Iteration]
    vocab: list[str] | None = None
    source: str = "<memory>"      # the file it came from, for error messages

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        path = Path(path)
        try:
            raw_text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise TraceFormatError(f"trace file {str(path)!r} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise TraceFormatError(f"trace file {str(path)!r} cannot be read: {exc}") from exc
        try:
            data = json.loads(raw_text)
        except ValueError as exc:
            raise TraceFormatError(f"trace file {str(path)!r} is not valid JSON: {exc}") from exc
        return cls.from_json(data, source=str(path))

    @classmethod
    def from_json(cls, data: Any, *, source: str = "<memory>") -> "Trace":
        return _TraceReader(source).read(data)

    def to_json(self) -> dict[str, Any]:
        meta = self.metadata
        metadata: dict[str, Any] = {
            "model": meta.model,
            "tokenizer": dict(meta.tokenizer),
            "hand_written": meta.hand_written,
            "token_rate": meta.token_rate,
            "problem": meta.problem,
            "notes": meta.notes,
            "think_end": meta.think_end,
            "created": meta.created,
        }
        # Optional fields are written only when set, so traces without them stay as they were.
        if meta.timing:
            metadata["timing"] = meta.timing
        if meta.imported_from:
            metadata["imported_from"] = list(meta.imported_from)
        data: dict[str, Any] = {"format": TRACE_FORMAT, "version": TRACE_VERSION, "metadata": metadata}
        if self.vocab is not None:
            data["vocab"] = list(self.vocab)
        data["iterations"] = [_iteration_json(iteration) for iteration in self.iterations]
        return data

    def save(self, path: str | Path) -> Path:
        """Write the trace (validated first, so a written file always loads)."""
        data = self.to_json()
        Trace.from_json(data, source=str(path))
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # One chunk per line keeps multi-thousand-token traces diffable without bloating them.
        path.write_text(_dump(data), encoding="utf-8")
        return path

    def tokenizer(self, override: str | None = None) -> Any:
        """The tokenizer the trace's ids belong to (`override`: a local tokenizer directory)."""
        from specgen.engines.tokenizer_loading import HFTokenizer

        if override is not None:
            return HFTokenizer(override, engine_name="replay")
        if self.metadata.tokenizer["kind"] == PIECES_KIND:
            return PieceTokenizer(self.vocab or [])
        return HFTokenizer(self.metadata.tokenizer["name_or_path"], engine_name="replay")


def _segment_json(segment: Segment) -> dict[str, Any]:
    return {"chunks": [[round(chunk.t, 6), list(chunk.token_ids), chunk.text] for chunk in segment.chunks]}


def _iteration_json(iteration: Iteration) -> dict[str, Any]:
    data: dict[str, Any] = {}
    # Optional: written only when known, so traces without it stay as they were.
    if iteration.record is not None:
        record = iteration.record
        data["record"] = ({"id": record.id} if record.id is not None else {}) | {
            "file": record.file, "line": record.line}
    if iteration.messages is not None:
        data["messages"] = [dict(message) for message in iteration.messages]
    data["reasoning"] = _segment_json(iteration.reasoning)
    data["final"] = _segment_json(iteration.final)
    data["forks"] = [
        {"position": fork.position, "suffix_text": fork.suffix_text, "completion": _segment_json(fork.completion)}
        for fork in iteration.forks
    ]
    return data


def _dump(data: dict[str, Any]) -> str:
    """JSON with one chunk per line."""
    def chunks_block(segment: dict[str, Any], indent: str) -> str:
        lines = [json.dumps(chunk, ensure_ascii=False) for chunk in segment["chunks"]]
        if not lines:
            return '{"chunks": []}'
        inner = (",\n" + indent + "  ").join(lines)
        return '{"chunks": [\n' + indent + "  " + inner + "\n" + indent + "]}"

    head = {key: value for key, value in data.items() if key != "iterations"}
    text = json.dumps(head, ensure_ascii=False, indent=1)[:-2]
    parts = [text + ',\n "iterations": [']
    rendered_iterations = []
    for iteration in data["iterations"]:
        fields = []
        if "record" in iteration:
            fields.append('  "record": ' + json.dumps(iteration["record"], ensure_ascii=False))
        if "messages" in iteration:
            fields.append('  "messages": ' + json.dumps(iteration["messages"], ensure_ascii=False))
        fields.append('  "reasoning": ' + chunks_block(iteration["reasoning"], "  "))
        fields.append('  "final": ' + chunks_block(iteration["final"], "  "))
        forks = []
        for fork in iteration["forks"]:
            forks.append(
                '   {"position": ' + str(fork["position"]) + ', "suffix_text": '
                + json.dumps(fork["suffix_text"], ensure_ascii=False) + ',\n    "completion": '
                + chunks_block(fork["completion"], "    ") + "}"
            )
        fields.append('  "forks": [' + ("\n" + ",\n".join(forks) + "\n  " if forks else "") + "]")
        rendered_iterations.append(" {\n" + ",\n".join(fields) + "\n }")
    parts.append("\n" + ",\n".join(rendered_iterations) + "\n ]\n}\n")
    return "".join(parts)


# -- strict reading --------------------------------------------------------------------------------


class _TraceReader:
    def __init__(self, source: str) -> None:
        self.source = source
        self.vocab_size: int | None = None

    def fail(self, where: str, problem: str) -> TraceFormatError:
        return TraceFormatError(f"trace file {self.source!r}, field {where}: {problem}")

    def expect_dict(self, value: Any, where: str, required: set[str], optional: set[str] = frozenset()) -> dict:
        if not isinstance(value, dict):
            raise self.fail(where, f"must be an object, got {type(value).__name__}")
        missing = sorted(required - value.keys())
        if missing:
            raise self.fail(where, f"missing {', '.join(repr(m) for m in missing)}")
        unknown = sorted(value.keys() - required - optional)
        if unknown:
            raise self.fail(where, f"unknown field(s) {', '.join(repr(u) for u in unknown)}")
        return value

    def expect(self, value: Any, kind: type | tuple[type, ...], where: str, what: str) -> Any:
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.fail(where, f"must be {what}, got a boolean")
        if not isinstance(value, kind):
            raise self.fail(where, f"must be {what}, got {type(value).__name__}")
        return value

    def read(self, data: Any) -> Trace:
        top = self.expect_dict(data, "<top level>", {"format", "version", "metadata", "iterations"}, {"vocab"})
        if top["format"] != TRACE_FORMAT:
            raise self.fail("format", f"must be {TRACE_FORMAT!r}, got {top['format']!r}")
        if top["version"] != TRACE_VERSION:
            raise self.fail("version", f"this specgen reads version {TRACE_VERSION}, the file says {top['version']!r}")
        metadata = self.read_metadata(top["metadata"])
        vocab: list[str] | None = None
        if metadata.tokenizer["kind"] == PIECES_KIND:
            if "vocab" not in top:
                raise self.fail("vocab", f"required with tokenizer kind {PIECES_KIND!r}")
            vocab = self.expect(top["vocab"], list, "vocab", "a list of strings")
            try:
                self.vocab_size = PieceTokenizer(vocab).vocab_size
            except ValueError as exc:
                raise self.fail("vocab", str(exc)) from None
        elif "vocab" in top:
            raise self.fail("vocab", f"only allowed with tokenizer kind {PIECES_KIND!r}")
        iterations = self.expect(top["iterations"], list, "iterations", "a list")
        if not iterations:
            raise self.fail("iterations", "must hold at least one iteration")
        return Trace(
            metadata=metadata,
            iterations=[self.read_iteration(it, f"iterations[{i}]") for i, it in enumerate(iterations)],
            vocab=vocab,
            source=self.source,
        )

    def read_metadata(self, value: Any) -> TraceMetadata:
        where = "metadata"
        meta = self.expect_dict(
            value, where, {"model", "tokenizer", "hand_written", "problem"},
            {"token_rate", "notes", "think_end", "created", "timing", "imported_from"},
        )
        model = self.expect(meta["model"], str, "metadata.model", "a string")
        if not model:
            raise self.fail("metadata.model", "must not be empty")
        tokenizer = self.expect_dict(meta["tokenizer"], "metadata.tokenizer", {"kind"}, {"name_or_path"})
        kind = tokenizer["kind"]
        if kind == PIECES_KIND:
            if "name_or_path" in tokenizer:
                raise self.fail("metadata.tokenizer.name_or_path", f"not used with kind {PIECES_KIND!r}")
        elif kind == HUGGINGFACE_KIND:
            if not isinstance(tokenizer.get("name_or_path"), str) or not tokenizer["name_or_path"]:
                raise self.fail("metadata.tokenizer.name_or_path", f"required (a string) with kind {HUGGINGFACE_KIND!r}")
        else:
            raise self.fail("metadata.tokenizer.kind", f"must be {PIECES_KIND!r} or {HUGGINGFACE_KIND!r}, got {kind!r}")
        hand_written = self.expect(meta["hand_written"], bool, "metadata.hand_written", "true or false")
        token_rate = meta.get("token_rate")
        if hand_written:
            self.expect(token_rate, (int, float), "metadata.token_rate", "a number (tokens/s) for a hand-written trace")
            if not math.isfinite(token_rate) or token_rate <= 0:
                raise self.fail("metadata.token_rate", f"must be > 0, got {token_rate}")
        elif token_rate is not None:
            self.expect(token_rate, (int, float), "metadata.token_rate", "a number or null")
        problem = self.expect(meta["problem"], str, "metadata.problem", "a string")
        notes = self.expect(meta.get("notes", ""), str, "metadata.notes", "a string")
        think_end = self.expect(meta.get("think_end", "</think>"), str, "metadata.think_end", "a string")
        created = self.expect(meta.get("created", ""), str, "metadata.created", "a string")
        timing = self.expect(meta.get("timing", ""), str, "metadata.timing", "a string")
        if timing not in ("", "recorded", "rate"):
            raise self.fail("metadata.timing", f"must be 'recorded' or 'rate', got {timing!r}")
        imported_from = self.expect(meta.get("imported_from", []), list, "metadata.imported_from", "a list of strings")
        for index, item in enumerate(imported_from):
            self.expect(item, str, f"metadata.imported_from[{index}]", "a string")
        return TraceMetadata(
            model=model, tokenizer=dict(tokenizer), hand_written=hand_written, problem=problem,
            token_rate=float(token_rate) if token_rate is not None else None, notes=notes,
            think_end=think_end, created=created, timing=timing, imported_from=list(imported_from),
        )

    def read_iteration(self, value: Any, where: str) -> Iteration:
        it = self.expect_dict(value, where, {"reasoning", "final", "forks"}, {"messages", "record"})
        record = self.read_record(it["record"], f"{where}.record") if "record" in it else None
        messages = None
        if "messages" in it:
            messages = self.expect(it["messages"], list, f"{where}.messages", "a list")
            for index, message in enumerate(messages):
                self.expect_dict(message, f"{where}.messages[{index}]", {"role", "content"})
                for key in ("role", "content"):
                    self.expect(message[key], str, f"{where}.messages[{index}].{key}", "a string")
        reasoning = self.read_segment(it["reasoning"], f"{where}.reasoning")
        final = self.read_segment(it["final"], f"{where}.final")
        forks_raw = self.expect(it["forks"], list, f"{where}.forks", "a list")
        forks: list[ForkRecording] = []
        for index, fork_raw in enumerate(forks_raw):
            fork_where = f"{where}.forks[{index}]"
            fork = self.expect_dict(fork_raw, fork_where, {"position", "completion"}, {"suffix_text"})
            position = self.expect(fork["position"], int, f"{fork_where}.position", "an integer")
            if not 0 <= position <= reasoning.num_tokens:
                raise self.fail(
                    f"{fork_where}.position",
                    f"must be between 0 and the reasoning's {reasoning.num_tokens} tokens, got {position}",
                )
            if forks and position <= forks[-1].position:
                raise self.fail(f"{fork_where}.position", f"must be greater than the previous fork's {forks[-1].position}")
            suffix_text = self.expect(fork.get("suffix_text", ""), str, f"{fork_where}.suffix_text", "a string")
            completion = self.read_segment(fork["completion"], f"{fork_where}.completion")
            forks.append(ForkRecording(position=position, completion=completion, suffix_text=suffix_text))
        return Iteration(reasoning=reasoning, final=final, forks=forks, messages=messages, record=record)

    def read_record(self, value: Any, where: str) -> SourceRecord:
        raw = self.expect_dict(value, where, {"file", "line"}, {"id"})
        file = self.expect(raw["file"], str, f"{where}.file", "a string")
        line = self.expect(raw["line"], int, f"{where}.line", "an integer")
        if line < 1:
            raise self.fail(f"{where}.line", f"must be >= 1, got {line}")
        record_id = self.expect(raw["id"], str, f"{where}.id", "a string") if "id" in raw else None
        return SourceRecord(file=file, line=line, id=record_id)

    def read_segment(self, value: Any, where: str) -> Segment:
        segment = self.expect_dict(value, where, {"chunks"})
        chunks_raw = self.expect(segment["chunks"], list, f"{where}.chunks", "a list")
        chunks: list[Chunk] = []
        previous_t = 0.0
        for index, raw in enumerate(chunks_raw):
            chunk_where = f"{where}.chunks[{index}]"
            if not isinstance(raw, list) or len(raw) != 3:
                raise self.fail(chunk_where, "must be [timestamp, [token ids], text]")
            t, token_ids, text = raw
            self.expect(t, (int, float), f"{chunk_where}[0]", "a timestamp in seconds")
            if not math.isfinite(t) or t < previous_t:
                raise self.fail(f"{chunk_where}[0]", f"timestamp {t} must be finite and not before the previous {previous_t}")
            self.expect(token_ids, list, f"{chunk_where}[1]", "a list of token ids")
            if not token_ids:
                raise self.fail(f"{chunk_where}[1]", "must hold at least one token id")
            for position, token_id in enumerate(token_ids):
                if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
                    raise self.fail(f"{chunk_where}[1][{position}]", f"{token_id!r} is not a token id")
                if self.vocab_size is not None and token_id >= self.vocab_size:
                    raise self.fail(
                        f"{chunk_where}[1][{position}]",
                        f"token id {token_id} is outside the trace's vocabulary (size {self.vocab_size})",
                    )
            self.expect(text, str, f"{chunk_where}[2]", "a string")
            chunks.append(Chunk(t=float(t), token_ids=list(token_ids), text=text))
            previous_t = float(t)
        return Segment(chunks)


# -- hand-written traces ---------------------------------------------------------------------------


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def decode(self, token_ids: list[int]) -> str: ...


class TraceBuilder:
    """Builds a hand-written trace: timing comes from a stated token rate, never from a model.

    Args:
        token_rate: reasoning (and final answer) tokens per second.
        problem: the problem's name, e.g. "level1/19_ReLU".
        tokenizer: None for the built-in piece tokenizer (vocabulary stored in the trace), or a
            local Hugging Face tokenizer directory, to write ids of a real model's tokenizer.
        ttft_s: seconds from the reasoning request to its first token.
        fork_ttft_s: seconds from a fork request to its first token.
        fork_token_rate: tokens/s of fork completions (default: `token_rate`).
        notes: free text for the metadata (say what the trace shows).
    """

    def __init__(
        self,
        *,
        token_rate: float,
        problem: str,
        tokenizer: str | None = None,
        model: str = "hand-written",
        ttft_s: float = 0.5,
        fork_ttft_s: float = 0.15,
        fork_token_rate: float | None = None,
        notes: str = "",
        think_end: str = "</think>",
        hand_written: bool = True,
    ) -> None:
        if not token_rate > 0:
            raise ValueError(f"token_rate must be > 0, got {token_rate}")
        self.token_rate = float(token_rate)
        self.fork_token_rate = float(fork_token_rate or token_rate)
        self.ttft_s = ttft_s
        self.fork_ttft_s = fork_ttft_s
        self.problem = problem
        self.model = model
        self.notes = notes
        self.think_end = think_end
        self.hand_written = hand_written     # False for generated traces (the metadata says which)
        self._iterations: list[Iteration] = []
        if tokenizer is None:
            self._pieces: PieceTokenizer | None = PieceTokenizer()
            self._tokenizer_spec = {"kind": PIECES_KIND}
            self._hf = None
        else:
            from specgen.engines.tokenizer_loading import HFTokenizer

            self._pieces = None
            self._tokenizer_spec = {"kind": HUGGINGFACE_KIND, "name_or_path": str(tokenizer)}
            self._hf = HFTokenizer(str(tokenizer), engine_name="trace builder")

    def _encode(self, text: str) -> list[int]:
        if self._pieces is not None:
            return self._pieces.encode(text, extend=True)
        return self._hf.encode(text)

    def _timed_segment(self, text: str, start_s: float, rate: float) -> Segment:
        """One chunk per token at `rate`; tokens whose text is only part of a character share a chunk."""
        ids = self._encode(text)
        chunks: list[Chunk] = []
        pending: list[int] = []
        for index, token_id in enumerate(ids):
            pending.append(token_id)
            if self._pieces is not None:
                piece = self._pieces.token_text(token_id)
            else:
                # Decode with a few tokens of context: tokenizers may drop a leading space at the start.
                first = index - len(pending) + 1
                context_start = max(0, first - 4)
                before = self._hf.decode(ids[context_start:first])
                after = self._hf.decode(ids[context_start:index + 1])
                piece = after[len(before):] if after.startswith(before) else self._hf.decode(pending)
            if piece.endswith("\ufffd") and index + 1 < len(ids):
                continue                      # part of a multi-byte character: wait for the rest
            chunks.append(Chunk(t=start_s + index / rate, token_ids=pending, text=piece))
            pending = []
        return Segment(chunks)

    def add_iteration(
        self,
        reasoning_text: str,
        *,
        forks: dict[int | str, str] | list[tuple[int | str, str]],
        final_text: str,
        messages: list[dict[str, str]] | None = None,
        suffix_text: str = DEFAULT_FORK_SUFFIX,
    ) -> int:
        """Add one iteration; returns its index.

        `forks` maps a position to the completion a fork made there. A position is a token count of
        the reasoning (int) or a marker (str): the fork happens right after the marker's first
        occurrence in `reasoning_text`. `final_text` is what follows the think-end tag.
        """
        if self.think_end in reasoning_text:
            raise ValueError(f"reasoning_text must not contain {self.think_end!r}; the builder closes the reasoning")
        reasoning = self._timed_segment(reasoning_text, self.ttft_s, self.token_rate)
        reasoning_end_s = self.ttft_s + reasoning.num_tokens / self.token_rate
        final = self._timed_segment(f"{self.think_end}\n\n{final_text}", reasoning_end_s, self.token_rate)
        # Token count before each character offset, to place marker positions.
        boundaries: list[tuple[int, int]] = []   # (chars so far, tokens so far) after each chunk
        chars = tokens = 0
        for chunk in reasoning.chunks:
            chars += len(chunk.text)
            tokens += len(chunk.token_ids)
            boundaries.append((chars, tokens))
        recordings: list[ForkRecording] = []
        items = list(forks.items()) if isinstance(forks, dict) else list(forks)
        for key, completion_text in items:
            if isinstance(key, str):
                found = reasoning_text.find(key)
                if found < 0:
                    raise ValueError(f"fork marker {key!r} does not occur in the reasoning text")
                end = found + len(key)
                position = next((tok for ch, tok in boundaries if ch >= end), reasoning.num_tokens)
            elif isinstance(key, int) and not isinstance(key, bool):
                position = key
                if not 0 <= position <= reasoning.num_tokens:
                    raise ValueError(f"fork position {position} is outside the reasoning's {reasoning.num_tokens} tokens")
            else:
                raise ValueError(f"fork key {key!r} must be a token position (int) or a marker (str)")
            completion = self._timed_segment(completion_text, self.fork_ttft_s, self.fork_token_rate)
            recordings.append(ForkRecording(position=position, completion=completion, suffix_text=suffix_text))
        recordings.sort(key=lambda fork: fork.position)
        for earlier, later in zip(recordings, recordings[1:]):
            if earlier.position == later.position:
                raise ValueError(f"two forks at reasoning position {later.position}")
        self._iterations.append(Iteration(reasoning=reasoning, final=final, forks=recordings, messages=messages))
        return len(self._iterations) - 1

    def build(self) -> Trace:
        if not self._iterations:
            raise ValueError("add at least one iteration before building the trace")
        metadata = TraceMetadata(
            model=self.model,
            tokenizer=dict(self._tokenizer_spec),
            hand_written=self.hand_written,
            problem=self.problem,
            token_rate=self.token_rate,
            notes=self.notes,
            think_end=self.think_end,
            created=_datetime.datetime.now(_datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        vocab = self._pieces.vocab if self._pieces is not None else None
        return Trace(metadata=metadata, iterations=list(self._iterations), vocab=vocab)

    def save(self, path: str | Path) -> Path:
        return self.build().save(path)
