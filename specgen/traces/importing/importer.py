"""Import of real reasoning: logs of a reasoning model become replayable specgen traces.

    specgen trace import FILE... --out DIR [--tokens-per-s R] [--tokenizer DIR] [--prompt FILE]
    specgen.traces.importing.import_traces(paths, out_dir, ...) -> [trace paths]

One trace file is written per conversation, with one iteration per turn: `<problem>.trace.json`
when the problem has one, else `<problem>.<sample>.trace.json` each (the sample field's value, or
the conversation's index in input order from 0). The inputs are what users already have; nothing
is annotated by hand, and imported traces hold no pre-written fork outputs (`forks` is empty:
forks are written at replay time by a fork model).

Accepted input (each file is detected by its content; several kinds may be given at once). Files
are UTF-8, with or without a byte-order mark, with LF or CRLF line ends:

1. Chat-completion responses, as one JSON document (an object or an array of them), as JSON Lines,
   or as JSON objects one after another. A record is any of
     - a response `{"model": ..., "choices": [{"message": {"reasoning_content": ..., "content": ...}}]}`
       (`reasoning` is read like `reasoning_content`), with the chat beside it in a top-level
       `"messages"` (or `"prompt"`) field when there is one;
     - `{"request": {"messages": [...], ...}, "response": {...}}` (also `"completion"` or `"output"`
       for the response, and the OpenAI batch shape, whose response and request sit in `"body"`);
     - a whole conversation `{"messages": [..., {"role": "assistant", "reasoning_content": ...,
       "content": ...}, ...]}`: every assistant message with reasoning is one turn, the messages
       before it its chat;
     - `{"messages": [...], "text": "<think>...</think>answer"}` (`"output"`, `"completion"` and
       `"response"` are read like `"text"` when they hold a string), and legacy completions whose
       `choices[0].text` holds the think tags.
   A message without `reasoning_content` whose content holds the think-end tag is split there.
2. Plain text: `<think>reasoning</think>answer` (the opening tag may be missing, as when the chat
   template opened it); a later `<think>` starts the next turn. The prompt comes from `--prompt`.
3. Streamed chunk logs (JSON Lines, or raw SSE `data: {...}` lines): OpenAI stream chunks
   `{"id": ..., "choices": [{"delta": {"reasoning_content": ..., "content": ...}}]}`, with their
   arrival time in a field `t` (also `time`, `arrival_time`, `arrival`, `timestamp`, `ts`: seconds,
   or an ISO-8601 time), either beside the chunk's fields or as `{"t": ..., "chunk": {...}}`
   (`"data"` works like `"chunk"`). A line without `choices` that carries `messages` or `request`
   opens a stream and gives its chat (its own time field, if any, is when the request was sent);
   a new chunk `id` also starts a new stream. Times are seconds since the request was sent; when
   they are absolute (epoch seconds or ISO) and no request time is logged, the first chunk is put
   `ttft_s` after the request. A chunk's own `created` counts as its arrival time only when it
   varies within a stream (OpenAI's is the request's second, the same for every chunk).

Naming the problem: an explicit `problem` / `problem_name` field (top level, or in `metadata`, or in
the request's `metadata`), else `--problem`; otherwise it is recovered from the prompt: the
`class Model` source the user messages embed (a fenced code block or raw text) is matched,
whitespace-normalized, against the bundled problems and `--problems` directories. A complete
embedded source (class Model, get_inputs, get_init_inputs) that matches none is written next to the
trace as `imported_<hash>.py`, and the trace names that problem, so it is still usable. A problem
found in a `--problems` directory is copied next to the trace as well.

Conversations: independent samples of a problem are traces of their own; a bench replays a trace's
turns as iterations with feedback between them, which independent samples never had. Turns are
one conversation when the input says so: the turns of one conversation record, or of one
plain-text file; records of a problem with the same `sample` / `sample_id` / `sample_index` /
`conversation_id` field (top level or `metadata`; then every record of the problem needs one);
records numbered by a turn field, each number once; or a record whose chat shows the last turn of
an earlier one: that turn's answer as an assistant message with a message after it (the feedback),
or a code block of that answer, new to its chat, quoted in the later prompt (a loop that starts
each iteration afresh, as specgen's own does). When turn numbers repeat without sample fields, a
later turn must show which conversation it continues.

Turn order: an explicit `turn` / `iteration` / `turn_index` field (top level or `metadata`) when every
turn of a conversation has one, else the order of the files and of the records in them.

Duplicates: a record with the same problem, chat, reasoning and answer as an earlier one (logged
twice, a file given twice) is imported once; records that repeat an earlier record's id
(`custom_id`, `id`) with other content are imported, and both are reported, a warning line per
kind with counts (`on_warning`; the CLI prints them after what it wrote).

Size: a record (a JSON value, the text of a stream, a plain-text turn) may hold `max_record_mb`
(`--max-record-mb`, default `MAX_RECORD_MB`) of text; importing costs some 200 times a turn's text
in memory. Files are read a block at a time, so a larger record stops the import before it is read
in full, with an error naming the file, the line and the record.

Timing: a stream with arrival times keeps its real token-time curve (`timing: "recorded"`). Any
other turn is timed at `tokens_per_s` (required then; `timing: "rate"`, `token_rate` the rate), the
first token `ttft_s` after the request. A problem's turns must all be timed the same way.

Tokenization: `tokenizer` (a local Hugging Face tokenizer directory) gives the model's own ids and
the trace names it; otherwise the trace carries a piece vocabulary built from its text (as
hand-written traces do), with the pieces joined to about `CHARS_PER_TOKEN` characters a token,
the density of real BPE tokenizers on reasoning, so token counts and rate timing look realistic.

The reasoning segment is the reasoning text exactly; the final segment is the think-end tag, a
blank line unless the answer begins with white space, and the answer (no answer: an empty final).

Errors (`TraceImportError`, a `UsageError`: one line, exit code 2 from the CLI) name the file, the
line and the field. Nothing is half-imported: everything is written to a temporary directory inside
the output directory and moved into place only when every input imported; on any error what this
call wrote is removed (and files it would replace are restored). So it is on SIGINT and SIGTERM:
during an import SIGTERM raises `ImportInterrupted` (the CLI exits 143, SIGINT 130), and signals
that come while the import undoes its writes, or once its files are in place, wait until it is done.
"""
from __future__ import annotations

import ast
import bisect
import codecs
import contextlib
import datetime as _datetime
import hashlib
import json
import math
import os
import re
import shutil
import signal
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Sequence

from specgen.engines.base import EngineError
from specgen.errors import UsageError
from specgen.traces.format import HUGGINGFACE_KIND, Chunk, Iteration, Segment, Trace, TraceMetadata
from specgen.traces.tokenizer import SPECIAL_TOKENS, PieceTokenizer, split_pieces
from specgen.traces.tokenizer import TOKENIZER_KIND as PIECES_KIND

TRACE_SUFFIX = ".trace.json"
CHARS_PER_TOKEN = 3.6            # real BPE tokenizers on English reasoning with code
_MAX_JOINED_CHARS = 10           # a joined piece stays word-sized
_MAX_JOINED_SPACE = 16           # runs of indentation join further
TIME_KEYS = ("t", "time", "arrival_time", "arrival", "timestamp", "ts")
PROBLEM_KEYS = ("problem", "problem_name")
TURN_KEYS = ("turn", "iteration", "turn_index")
SAMPLE_KEYS = ("sample", "sample_id", "sample_index", "conversation_id")
ID_KEYS = ("custom_id", "id")
_FIELD_KEYS = frozenset((*PROBLEM_KEYS, *TURN_KEYS, *SAMPLE_KEYS, "metadata"))   # a chunk line may carry them
MAX_RECORD_MB = 8.0              # a real reasoning record is well under 1 MB; importing costs ~200x its text in memory
_ABSOLUTE_TIME_S = 1e6           # times above this are clock times, not seconds since the request
_NAME = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
_CLASS_MODEL = re.compile(r"^class[ \t]+Model\b[ \t]*[(:]", re.MULTILINE)


class TraceImportError(UsageError):
    """Input that cannot be imported; the message names the file, the line and the field."""


# -- where things are ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Place:
    file: str
    line: int

    def error(self, problem: str, field_name: str | None = None) -> TraceImportError:
        where = f"{self.file}, line {self.line}"
        if field_name:
            where += f", field {field_name}"
        return TraceImportError(f"{where}: {problem}")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


# -- timed text ------------------------------------------------------------------------------------


class _Timeline:
    """Arrival times of a text: characters before `ends[i]` (and after `ends[i-1]`) came at `ts[i]`."""

    def __init__(self) -> None:
        self.ends: list[int] = []
        self.ts: list[float] = []
        self.length = 0

    def add(self, chars: int, t: float) -> None:
        if chars <= 0:
            return
        self.length += chars
        if self.ts and self.ts[-1] == t:
            self.ends[-1] = self.length
        else:
            self.ends.append(self.length)
            self.ts.append(t)

    def time_at(self, index: int) -> float:
        position = bisect.bisect_right(self.ends, index)
        return self.ts[min(position, len(self.ts) - 1)]

    def slice(self, start: int, stop: int) -> "_Timeline":
        part = _Timeline()
        previous = 0
        for end, t in zip(self.ends, self.ts):
            lo, hi = max(previous, start), min(end, stop)
            if hi > lo:
                part.add(hi - lo, t)
            previous = end
            if end >= stop:
                break
        return part


def _timed_join(parts: list[tuple[str, float]]) -> tuple[str, _Timeline]:
    timeline = _Timeline()
    for text, t in parts:
        timeline.add(len(text), t)
    return "".join(text for text, _ in parts), timeline


# -- turns -----------------------------------------------------------------------------------------


@dataclass
class _Turn:
    place: _Place
    reasoning: str
    final: str                             # from the think-end tag on; "" when no answer came
    messages: list[dict[str, str]] | None
    reasoning_field: str                   # where the reasoning was read, for errors
    problem: str | None = None
    problem_field: str = "problem"
    turn: int | None = None
    model: str | None = None
    created: float | None = None
    reasoning_times: _Timeline | None = None   # None: rate timing
    final_times: _Timeline | None = None
    order: int = 0                         # input order over all files
    unit: int = 0                          # turns of one unit (a record, a plain-text file) share it
    sample: str | None = None              # an explicit sample (conversation) key
    sample_field: str = "sample"
    record_id: str | None = None           # the record's own id (custom_id, id), for duplicates

    def answer(self, think_end: str) -> str:
        """The answer without the think-end tag (as a chat history holds it)."""
        return (self.final[len(think_end):] if self.final.startswith(think_end) else self.final).strip()


@dataclass
class _Settings:
    think_end: str
    think_start: str
    prompt: list[dict[str, str]] | None
    ttft_s: float
    max_record_chars: int = int(MAX_RECORD_MB * 1e6)


def _think_start(think_end: str) -> str:
    return "<" + think_end[2:] if think_end.startswith("</") else ""


def _final_text(think_end: str, answer: str) -> tuple[str, int]:
    """The final segment for an answer read separately from the reasoning, and the length of the
    part before the answer."""
    if not answer:
        return "", 0
    head = think_end if answer[:1].isspace() else think_end + "\n\n"
    return head + answer, len(head)


def _split_think(text: str, settings: _Settings) -> tuple[int, int] | None:
    """(reasoning start, think-end offset) in `text`, or None when it holds no think-end tag."""
    end = text.find(settings.think_end)
    if end < 0:
        return None
    start = 0
    stripped = len(text) - len(text.lstrip())
    if settings.think_start and text.startswith(settings.think_start, stripped) and stripped + len(settings.think_start) <= end:
        start = stripped + len(settings.think_start)
    return start, end


def _reasoning_turn(place: _Place, reasoning: str | None, answer: str | None, *, reasoning_field: str,
                    settings: _Settings) -> tuple[str, str, int, int]:
    """(reasoning, final, offset of the answer in final, offset of the reasoning in the answer-only
    text) from a message's reasoning and answer fields; think tags in the answer when there is no
    reasoning field. The last value is -1 when reasoning and answer were separate."""
    if reasoning is not None and reasoning.strip():
        if settings.think_end in reasoning:
            raise place.error(f"the reasoning holds the think-end tag {settings.think_end!r}", reasoning_field)
        final, head = _final_text(settings.think_end, answer or "")
        return reasoning, final, head, -1
    if answer:
        split = _split_think(answer, settings)
        if split is not None:
            start, end = split
            if answer[start:end].strip():
                return answer[start:end], answer[end:], 0, start
    raise place.error(
        "no reasoning: the record has neither a reasoning field (reasoning_content, reasoning) nor "
        f"an answer holding {settings.think_end!r}", reasoning_field)


# -- reading files ---------------------------------------------------------------------------------


_WS = re.compile(r"[\s\ufeff]*")     # a byte-order mark where files were joined counts as space
_BLOCK_BYTES = 1 << 20
_CUT_ERROR_CHARS = 64                # a JSON error this close to the end of what was read may be a cut


def _megabytes(chars: int) -> str:
    return f"{chars / 1e6:g} MB"


class _Text:
    """A file's text, read a block at a time as the parsing asks for it, so that memory holds about
    one record (and a block) however large the file is, and a record over the limit is refused
    before the rest of it is read. UTF-8 with or without a byte-order mark; CRLF line ends are read
    as LF (a lone CR is text). `pos` is where the parsing is; what lies before it is dropped when
    more is read, so offsets into `text` hold only until the next `fill`."""

    def __init__(self, path: str, handle: BinaryIO, limit: int) -> None:
        self.path = path
        self.limit = limit                 # characters a record may span
        self.text = ""
        self.pos = 0
        self.eof = False
        self._handle = handle
        self._decoder = codecs.getincrementaldecoder("utf-8-sig")()
        self._bytes = 0                    # bytes read before the block being decoded
        self._held_cr = False              # a block ended in CR: the next may start with its LF
        self._line = 1                     # line number at text[0]
        self._column = 0                   # characters of that line before text[0]
        self._counted = (0, 1)             # (offset, its line): lines are counted forward

    def fill(self, at_least: int = 0) -> bool:
        """Read on (a block, or about `at_least` characters when more); False at the end."""
        if self.eof:
            return False
        if self.pos:
            self._drop(self.pos)
        try:
            data = self._handle.read(max(_BLOCK_BYTES, at_least))
        except OSError as exc:
            raise TraceImportError(f"{self.path}: cannot be read ({exc.strerror or exc})") from None
        try:
            chunk = self._decoder.decode(data, not data)
        except UnicodeDecodeError as exc:
            skipped = 3 if self._bytes == 0 and data.startswith(codecs.BOM_UTF8) else 0
            raise TraceImportError(f"{self.path}: not UTF-8 text ({exc.reason} at byte "
                                   f"{self._bytes + skipped + exc.start})") from None
        self._bytes += len(data)
        if self._held_cr:
            chunk, self._held_cr = "\r" + chunk, False
        if data and chunk.endswith("\r"):
            chunk, self._held_cr = chunk[:-1], True
        self.text += chunk.replace("\r\n", "\n")
        self.eof = not data
        return True

    def _drop(self, count: int) -> None:
        newline = self.text.rfind("\n", 0, count)
        self._column = count - newline - 1 if newline >= 0 else self._column + count
        self._line = self.line_at(count)
        self.text = self.text[count:]
        self.pos -= count
        self._counted = (0, self._line)

    def line_at(self, offset: int) -> int:
        done, line = self._counted
        if offset < done:
            done, line = 0, self._line
        line += self.text.count("\n", done, offset)
        self._counted = (offset, line)
        return line

    def column_at(self, offset: int) -> int:
        newline = self.text.rfind("\n", 0, offset)
        return offset - newline if newline >= 0 else self._column + offset + 1

    def startswith(self, prefix: str) -> bool:
        while len(self.text) - self.pos < len(prefix) and self.fill():
            pass
        return self.text.startswith(prefix, self.pos)

    def skip_space(self) -> None:
        while True:
            self.pos = _WS.match(self.text, self.pos).end()
            if self.pos < len(self.text) or not self.fill():
                return

    def at_end(self) -> bool:
        self.skip_space()
        return self.pos >= len(self.text)

    def lead(self) -> str:
        """The text from the first character that is not white space on (a few characters at least,
        where the file has them), without moving `pos`; "" for a blank file."""
        while True:
            start = _WS.match(self.text, self.pos).end()
            if len(self.text) - start >= 8 or self.eof:
                return self.text[start:start + 8]
            if start - self.pos > self.limit:
                raise TraceImportError(f"{self.path}, line 1: more than {_megabytes(self.limit)} of white "
                                       "space before anything to import")
            self.fill()

    def find(self, sub: str, start: int, too_large: Callable[[], TraceImportError]) -> int:
        """Where `sub` first occurs at or after `pos + start`, as an offset from `pos`, reading on as
        needed; -1 when the file ends first. The text from `pos` to the end of `sub` (or, when there
        is none, to the end of the file) must stay within the limit."""
        searched = start
        while True:
            found = self.text.find(sub, self.pos + searched)
            if found >= 0:
                if found + len(sub) - self.pos > self.limit:
                    raise too_large()
                return found - self.pos
            if len(self.text) - self.pos > self.limit:
                raise too_large()
            searched = max(start, len(self.text) - self.pos - len(sub) + 1)
            if not self.fill():
                return -1

    def skip_line(self, too_large: Callable[[], TraceImportError]) -> None:
        newline = self.find("\n", 0, too_large)
        self.pos = len(self.text) if newline < 0 else self.pos + newline + 1

    def decode(self, decoder: json.JSONDecoder, too_large: Callable[[], TraceImportError],
               fail: Callable[[json.JSONDecodeError], TraceImportError]) -> Any:
        """The JSON value at `pos`, reading on while it is incomplete, and never more than the
        limit of it: a value that has not ended within the limit is refused unparsed."""
        while True:
            start = self.pos
            try:
                value, end = decoder.raw_decode(self.text, start)
            except json.JSONDecodeError as exc:
                cut = not self.eof and (exc.msg.startswith("Unterminated string")
                                        or len(self.text) - exc.pos <= _CUT_ERROR_CHARS)
                if not cut:
                    raise fail(exc) from None
                if len(self.text) - start > self.limit:
                    raise too_large() from None
                self.fill(len(self.text) - start)
                continue
            if end - start > self.limit:
                raise too_large()
            if end >= len(self.text) and not self.eof:
                self.fill(len(self.text) - start)     # a number at the end of a block may go on
                continue
            self.pos = end
            return value


def _json_values(source: _Text) -> Iterator[tuple[int, Any]]:
    """(line, value) of every record: a top-level array's elements, or each of a sequence of JSON
    values (JSON Lines, concatenated objects, SSE `data:` lines). Records are read one at a time."""
    decoder = json.JSONDecoder()
    path = source.path
    number = 0

    def record() -> tuple[int, Any]:
        nonlocal number
        number += 1
        line = source.line_at(source.pos)
        ordinal = number

        def too_large() -> TraceImportError:
            return TraceImportError(
                f"{path}, line {line}: record {ordinal} is larger than {_megabytes(source.limit)}, the "
                "limit per record (--max-record-mb sets it)")

        def fail(exc: json.JSONDecodeError) -> TraceImportError:
            error_line = source.line_at(exc.pos)
            column = source.column_at(exc.pos)
            at = f"column {column}" if error_line == line else f"line {error_line}, column {column}"
            return TraceImportError(f"{path}, line {line}: not valid JSON (truncated or malformed: "
                                    f"{exc.msg} at {at})")

        return line, source.decode(decoder, too_large, fail)

    def line_too_large() -> TraceImportError:
        return TraceImportError(f"{path}, line {source.line_at(source.pos)}: a line longer than "
                                f"{_megabytes(source.limit)}, the limit per record (--max-record-mb sets it)")

    source.skip_space()
    if source.startswith("["):
        source.pos += 1
        source.skip_space()
        if source.startswith("]"):
            source.pos += 1
        else:
            while True:
                yield record()
                source.skip_space()
                if source.startswith(","):
                    source.pos += 1
                    source.skip_space()
                    continue
                if source.startswith("]"):
                    source.pos += 1
                    break
                line = source.line_at(source.pos)
                raise TraceImportError(
                    f"{path}, line {line}: not valid JSON (truncated or malformed: expected ',' or ']' "
                    f"at column {source.column_at(source.pos)})")
        if not source.at_end():
            raise TraceImportError(f"{path}, line {source.line_at(source.pos)}: text after the JSON array")
        return
    while not source.at_end():
        if source.text[source.pos] not in _SSE_STARTS:
            yield record()
            continue
        if source.startswith("data:"):         # server-sent events
            source.pos += 5
            source.skip_space()
            if source.startswith("[DONE]"):
                source.pos += 6
                continue
            if source.pos >= len(source.text):
                return
        elif any(source.startswith(prefix) for prefix in ("event:", "id:", "retry:", ":")):
            source.skip_line(line_too_large)
            continue
        yield record()


_SSE_STARTS = frozenset("deir:")          # first letters of the SSE fields data:, event:, id:, retry:, and :


def _is_json(lead: str) -> bool:
    return lead[:1] in ("{", "[") or lead.startswith("data:")


def _dict(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _string(place: _Place, value: Any, field_name: str, *, allow_none: bool = True) -> str | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, str):
        raise place.error(f"must be a string, got {type(value).__name__}", field_name)
    return value


def _content(place: _Place, value: Any, field_name: str) -> str:
    """A message's content: a string, null, or a list of text parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for index, part in enumerate(value):
            where = f"{field_name}[{index}]"
            if isinstance(part, str):
                texts.append(part)
                continue
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text", "output_text") \
                    or not isinstance(part.get("text"), str):
                raise place.error("only text parts can be imported", where)
            texts.append(part["text"])
        return "".join(texts)
    raise place.error(f"must be a string or a list of text parts, got {type(value).__name__}", field_name)


def _messages(place: _Place, value: Any, field_name: str) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise place.error(f"must be a list of messages, got {type(value).__name__}", field_name)
    messages = []
    for index, message in enumerate(value):
        where = f"{field_name}[{index}]"
        if not isinstance(message, dict):
            raise place.error(f"must be an object, got {type(message).__name__}", where)
        role = _string(place, message.get("role"), f"{where}.role", allow_none=False)
        messages.append({"role": role, "content": _content(place, message.get("content"), f"{where}.content")})
    return messages


def _explicit(place: _Place, containers: list[tuple[str, dict[str, Any] | None]], keys: Sequence[str]
              ) -> tuple[Any, str] | None:
    """The first of `keys` in the containers (each with its field path), and its field path."""
    for prefix, container in containers:
        if container is None:
            continue
        for key in keys:
            if key in container and container[key] is not None:
                return container[key], _join(prefix, key)
    return None


def _turn_fields(turn: _Turn, containers: list[tuple[str, dict[str, Any] | None]]) -> None:
    place = turn.place
    found = _explicit(place, containers, PROBLEM_KEYS)
    if found is not None:
        value, where = found
        if not isinstance(value, str) or not value.strip():
            raise place.error("must be a non-empty string (the problem's name)", where)
        turn.problem, turn.problem_field = value.strip(), where
    found = _explicit(place, containers, TURN_KEYS)
    if found is not None:
        value, where = found
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise place.error(f"must be a non-negative integer (the turn's number), got {value!r}", where)
        turn.turn = value
    found = _explicit(place, containers, SAMPLE_KEYS)
    if found is not None:
        value, where = found
        if isinstance(value, bool) or not (isinstance(value, int) and value >= 0
                                           or isinstance(value, str) and value.strip()):
            raise place.error(f"must be a non-negative integer or a non-empty string (the sample), got {value!r}",
                              where)
        turn.sample, turn.sample_field = str(value).strip(), where
    if turn.record_id is None:
        turn.record_id = _record_id(containers)
    for prefix, container in containers:
        if container is not None and isinstance(container.get("model"), str) and container["model"]:
            turn.model = turn.model or container["model"]
        if container is not None and isinstance(container.get("created"), (int, float)) \
                and not isinstance(container.get("created"), bool) and turn.created is None:
            turn.created = float(container["created"])


def _record_id(containers: list[tuple[str, dict[str, Any] | None]]) -> str | None:
    """A record's own id: the batch `custom_id`, else the first `id` (a response's, a chunk's)."""
    for key in ID_KEYS:
        for _, container in containers:
            value = container.get(key) if container is not None else None
            if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
                return str(value)
    return None


def _metadata_containers(prefix: str, record: dict[str, Any] | None) -> list[tuple[str, dict[str, Any] | None]]:
    if record is None:
        return []
    return [(prefix, record), (_join(prefix, "metadata"), _dict(record.get("metadata")))]


def _time_value(place: _Place, value: Any, field_name: str) -> float:
    if isinstance(value, bool):
        raise place.error("must be a time in seconds, got a boolean", field_name)
    if isinstance(value, (int, float)):
        t = float(value)
    elif isinstance(value, str):
        try:
            moment = _datetime.datetime.fromisoformat(value.strip())
        except ValueError:
            raise place.error(f"must be seconds or an ISO-8601 time, got {value!r}", field_name) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=_datetime.timezone.utc)
        t = moment.timestamp()
    else:
        raise place.error(f"must be a time in seconds, got {type(value).__name__}", field_name)
    if not math.isfinite(t):
        raise place.error(f"must be a finite time, got {value!r}", field_name)
    return t


def _time_field(place: _Place, containers: list[tuple[str, dict[str, Any] | None]]) -> tuple[float, str] | None:
    for prefix, container in containers:
        if container is None:
            continue
        for key in TIME_KEYS:
            if key in container and container[key] is not None:
                where = _join(prefix, key)
                return _time_value(place, container[key], where), where
    return None


# -- chunk streams ---------------------------------------------------------------------------------


@dataclass
class _StreamChunk:
    place: _Place
    t: float | None
    t_field: str
    created: float | None
    reasoning: str
    content: str


@dataclass
class _Stream:
    place: _Place                          # where it began (its request line or first chunk)
    messages: list[dict[str, str]] | None = None
    request_t: float | None = None
    chunk_id: Any = None
    chunks: list[_StreamChunk] = field(default_factory=list)
    containers: list[tuple[str, dict[str, Any] | None]] = field(default_factory=list)
    delta_field: str = "choices[0].delta"


def _stream_chunk_of(record: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(field path, chunk) when the record is a stream chunk (bare or wrapped)."""
    for key in ("chunk", "data"):
        inner = _dict(record.get(key))
        if inner is not None and _is_chunk(inner):
            return key, inner
    if _is_chunk(record):
        return "", record
    return None


def _is_chunk(value: dict[str, Any]) -> bool:
    if value.get("object") == "chat.completion.chunk":
        return True
    choices = value.get("choices")
    return isinstance(choices, list) and bool(choices) and isinstance(choices[0], dict) and "delta" in choices[0]


def _read_stream_chunk(place: _Place, record: dict[str, Any], prefix: str, chunk: dict[str, Any]) -> _StreamChunk:
    timed = _time_field(place, [("", record)] + ([(prefix, chunk)] if prefix else []))
    created = chunk.get("created")
    created_t = None
    if created is not None and not isinstance(created, bool) and isinstance(created, (int, float)):
        created_t = float(created)
    reasoning_parts: list[str] = []
    content_parts: list[str] = []
    choices = chunk.get("choices")
    if choices is not None and not isinstance(choices, list):
        raise place.error(f"must be a list, got {type(choices).__name__}", _join(prefix, "choices"))
    for index, choice in enumerate(choices or []):
        where = _join(prefix, f"choices[{index}]")
        if not isinstance(choice, dict):
            raise place.error(f"must be an object, got {type(choice).__name__}", where)
        if choice.get("index", 0) != 0:
            raise place.error("only the first choice of a stream (n=1) can be imported", f"{where}.index")
        delta = choice.get("delta")
        if delta is None:
            continue
        if not isinstance(delta, dict):
            raise place.error(f"must be an object, got {type(delta).__name__}", f"{where}.delta")
        for key in ("reasoning_content", "reasoning"):
            text = _string(place, delta.get(key), f"{where}.delta.{key}")
            if text:
                reasoning_parts.append(text)
                break
        content_parts.append(_content(place, delta.get("content"), f"{where}.delta.content"))
    return _StreamChunk(place=place, t=timed[0] if timed else None, t_field=timed[1] if timed else "t",
                        created=created_t, reasoning="".join(reasoning_parts), content="".join(content_parts))


def _finish_stream(stream: _Stream, settings: _Settings) -> _Turn:
    place = stream.place
    if not stream.chunks:
        raise place.error("a request with no response: no stream chunks follow it", "messages")
    # Chunks without text (the role, the finish reason, usage) say nothing about token times.
    chunks = [chunk for chunk in stream.chunks if chunk.reasoning or chunk.content]
    if not chunks:
        raise stream.chunks[0].place.error("no reasoning: the stream's chunks hold no text",
                                           f"{stream.delta_field}.reasoning_content")
    # Arrival times: explicit fields on every chunk, else `created` when it varies.
    timed = [chunk for chunk in chunks if chunk.t is not None]
    times: list[float] | None = None
    if timed:
        if len(timed) != len(chunks):
            missing = next(chunk for chunk in chunks if chunk.t is None)
            raise missing.place.error("this chunk has no arrival time while others in its stream have one",
                                      timed[0].t_field)
        times = [chunk.t for chunk in chunks]  # type: ignore[misc]
        fields = [chunk.t_field for chunk in chunks]
    elif all(chunk.created is not None for chunk in chunks) and len({chunk.created for chunk in chunks}) > 1:
        times = [chunk.created for chunk in chunks]  # type: ignore[misc]
        fields = ["created"] * len(chunks)
    if times is not None:
        for index in range(1, len(times)):
            if times[index] < times[index - 1]:
                raise chunks[index].place.error(
                    f"arrival time {times[index]} is before the previous chunk's {times[index - 1]} "
                    "(timestamps must not decrease)", fields[index])
        if stream.request_t is not None:
            origin = stream.request_t
            if (origin > _ABSOLUTE_TIME_S) != (times[0] > _ABSOLUTE_TIME_S):
                raise place.error(
                    f"the request's time {origin} and the first chunk's {times[0]} are not on one clock "
                    "(one is seconds since the request, the other a clock time)", "t")
        elif times[0] > _ABSOLUTE_TIME_S:
            origin = times[0] - settings.ttft_s
        else:
            origin = 0.0
        if times[0] < origin:
            raise chunks[0].place.error(f"arrival time {times[0]} is before the request was sent ({origin})",
                                        fields[0])
        times = [t - origin for t in times]
    reasoning_parts = [(chunk.reasoning, times[i] if times else 0.0) for i, chunk in enumerate(chunks) if chunk.reasoning]
    content_parts = [(chunk.content, times[i] if times else 0.0) for i, chunk in enumerate(chunks) if chunk.content]
    reasoning_text, reasoning_line = _timed_join(reasoning_parts)
    answer, answer_line = _timed_join(content_parts)
    reasoning, final, head, start = _reasoning_turn(
        place, reasoning_text if reasoning_parts else None, answer, settings=settings,
        reasoning_field=f"{stream.delta_field}.reasoning_content")
    turn = _Turn(place=place, reasoning=reasoning, final=final, messages=stream.messages,
                 reasoning_field=f"{stream.delta_field}.reasoning_content")
    if times is not None:
        if start < 0:
            turn.reasoning_times = reasoning_line
            final_line = _Timeline()
            if final:
                first_t = answer_line.ts[0]
                final_line.add(head, first_t)
                for end, t, previous in zip(answer_line.ends, answer_line.ts, [0] + answer_line.ends[:-1]):
                    final_line.add(end - previous, t)
            turn.final_times = final_line
        else:
            end = start + len(reasoning)
            turn.reasoning_times = answer_line.slice(start, end)
            turn.final_times = answer_line.slice(end, len(answer))
    _turn_fields(turn, stream.containers)
    return turn


# -- records ---------------------------------------------------------------------------------------


def _completion_turns(place: _Place, record: dict[str, Any], settings: _Settings) -> list[_Turn] | None:
    """Turns of a non-stream record, or None when the record is a request (a stream opener)."""
    request = _dict(record.get("request"))
    request_prefix = "request"
    if request is not None and _dict(request.get("body")) is not None:
        request, request_prefix = request["body"], "request.body"
    response: dict[str, Any] | None = None
    response_prefix = ""
    text_value: tuple[str, str] | None = None
    for key in ("response", "completion", "output"):
        value = record.get(key)
        if isinstance(value, dict):
            response, response_prefix = value, key
            if _dict(value.get("body")) is not None:
                response, response_prefix = value["body"], f"{key}.body"
            break
    if response is None and isinstance(record.get("choices"), list):
        response = record
    for key in ("text", "output", "completion", "response"):
        if text_value is None and isinstance(record.get(key), str):
            text_value = (record[key], key)
    messages: list[dict[str, str]] | None = None
    if request is not None and "messages" in request:
        messages = _messages(place, request["messages"], f"{request_prefix}.messages")
    elif "messages" in record:
        messages = _messages(place, record["messages"], "messages")
    else:
        for prefix, container in ((request_prefix, request), ("", record)):
            if container is not None and isinstance(container.get("prompt"), str):
                messages = [{"role": "user", "content": container["prompt"]}]
                break
    containers = (_metadata_containers("", record) + _metadata_containers(request_prefix, request)
                  + ([(response_prefix, response)] if response is not None and response is not record else []))
    if response is not None:
        choices = response.get("choices")
        where = _join(response_prefix, "choices")
        if not isinstance(choices, list) or not choices:
            raise place.error("must be a non-empty list (the response's choices)", where)
        choice = choices[0]
        if not isinstance(choice, dict):
            raise place.error(f"must be an object, got {type(choice).__name__}", f"{where}[0]")
        if "message" in choice:
            message = choice["message"]
            message_where = f"{where}[0].message"
            if not isinstance(message, dict):
                raise place.error(f"must be an object, got {type(message).__name__}", message_where)
            reasoning_key = "reasoning" if "reasoning_content" not in message and "reasoning" in message \
                else "reasoning_content"
            reasoning = _string(place, message.get(reasoning_key), f"{message_where}.{reasoning_key}")
            answer = _content(place, message.get("content"), f"{message_where}.content")
            reasoning, final, _, _ = _reasoning_turn(
                place, reasoning, answer, settings=settings, reasoning_field=f"{message_where}.{reasoning_key}")
            turn = _Turn(place, reasoning, final, messages, f"{message_where}.{reasoning_key}")
        else:
            text = _string(place, choice.get("text"), f"{where}[0].text") or ""
            turn = _text_turn(place, text, f"{where}[0].text", messages, settings)
        # The response names the model that ran (a request may name an alias).
        _turn_fields(turn, [(response_prefix, response)] + containers)
        return [turn]
    if text_value is not None:
        turn = _text_turn(place, text_value[0], text_value[1], messages, settings)
        _turn_fields(turn, containers)
        return [turn]
    if messages is not None and "messages" in record and request is None:
        turns = _conversation_turns(place, record["messages"], settings)
        if turns:
            for turn in turns:
                _turn_fields(turn, containers)
                turn.turn = None      # a conversation's turns are numbered by their order in it
            return turns
    if messages is not None or request is not None:
        return None
    raise place.error(
        "not an importable record: expected a chat completion ('choices' with a 'message'), a "
        "stream chunk ('choices' with a 'delta'), a 'request'/'response' pair, 'messages' with a "
        "'text', or a conversation whose assistant messages carry reasoning", "choices")


def _text_turn(place: _Place, text: str, field_name: str, messages: list[dict[str, str]] | None,
               settings: _Settings) -> _Turn:
    split = _split_think(text, settings)
    if split is None or not text[split[0]:split[1]].strip():
        raise place.error(f"no reasoning: the text holds no {settings.think_end!r} after a reasoning",
                          field_name)
    start, end = split
    return _Turn(place, text[start:end], text[end:], messages, field_name)


def _conversation_turns(place: _Place, raw_messages: list[Any], settings: _Settings) -> list[_Turn]:
    turns = []
    history: list[dict[str, str]] = []
    for index, message in enumerate(raw_messages):
        where = f"messages[{index}]"
        role = message["role"]
        content = _content(place, message.get("content"), f"{where}.content")
        if role == "assistant":
            key = "reasoning_content" if "reasoning_content" in message else "reasoning"
            reasoning = _string(place, message.get(key), f"{where}.{key}")
            has_tags = settings.think_end in content
            if (reasoning and reasoning.strip()) or has_tags:
                r, final, _, start = _reasoning_turn(place, reasoning, content, settings=settings,
                                                     reasoning_field=f"{where}.{key}")
                turns.append(_Turn(place, r, final, [dict(m) for m in history], f"{where}.{key}"))
                if start >= 0:        # think tags in the content: the history keeps the answer only
                    content = final[len(settings.think_end):].lstrip("\n")
        history.append({"role": role, "content": content})
    return turns


def _json_turns(source: _Text, settings: _Settings) -> list[_Turn]:
    path = source.path
    turns: list[_Turn] = []
    stream: _Stream | None = None
    stream_chars = 0
    units = 0

    def close() -> None:
        nonlocal stream, units
        if stream is not None:
            turn = _finish_stream(stream, settings)
            turn.unit, units = units, units + 1
            turns.append(turn)
            stream = None

    for line, record in _json_values(source):
        place = _Place(path, line)
        if not isinstance(record, dict):
            raise place.error(f"a record must be a JSON object, got {type(record).__name__}")
        found = _stream_chunk_of(record)
        if found is not None:
            prefix, chunk = found
            chunk_id = chunk.get("id")
            if stream is None or (stream.chunks and chunk_id is not None and stream.chunk_id is not None
                                  and chunk_id != stream.chunk_id):
                close()
                stream = _Stream(place=place)
            if stream.chunk_id is None:
                stream.chunk_id = chunk_id
            if not stream.chunks or not _FIELD_KEYS.isdisjoint(record) or not _FIELD_KEYS.isdisjoint(chunk):
                stream.containers += _metadata_containers("", record) + (
                    [(prefix, chunk)] if prefix else [])
            stream.delta_field = _join(prefix, "choices[0].delta")
            piece = _read_stream_chunk(place, record, prefix, chunk)
            stream_chars = (stream_chars if stream.chunks else 0) + len(piece.reasoning) + len(piece.content)
            if stream_chars > settings.max_record_chars:
                raise stream.place.error(
                    f"the stream that starts here holds more than {_megabytes(settings.max_record_chars)} "
                    "of text, the limit per record (--max-record-mb sets it)")
            stream.chunks.append(piece)
            continue
        if isinstance(record.get("choices"), list) and not record["choices"] and stream is not None:
            continue                  # a usage-only chunk at a stream's end
        completed = _completion_turns(place, record, settings)
        close()
        if completed is not None:
            for turn in completed:
                turn.unit = units
            units += 1
            turns.extend(completed)
            continue
        # A request: it opens the stream of the chunks that follow.
        request = _dict(record.get("request"))
        stream = _Stream(place=place)
        if request is not None and "messages" in request:
            stream.messages = _messages(place, request["messages"], "request.messages")
        elif "messages" in record:
            stream.messages = _messages(place, record["messages"], "messages")
        stream.containers = _metadata_containers("", record) + _metadata_containers("request", request)
        timed = _time_field(place, [("", record)])
        stream.request_t = timed[0] if timed else None
    close()
    if not turns:
        raise TraceImportError(f"{path}, line 1: no records to import")
    return turns


def _plain_text_turns(source: _Text, settings: _Settings) -> list[_Turn]:
    """The turns of a plain-text file, one at a time: a turn runs from one opening think tag to the
    next, and must stay within the limit per record."""
    path = source.path
    turns = []
    think_end, think_start = settings.think_end, settings.think_start
    while source.lead():              # something but white space is left
        line = source.line_at(source.pos)
        place = _Place(path, line)
        number = len(turns) + 1

        def too_large() -> TraceImportError:
            return place.error(f"turn {number} is larger than {_megabytes(source.limit)}, the limit per "
                               "record (--max-record-mb sets it)", "text")

        end = source.find(think_end, 0, too_large)
        if end < 0:
            raise place.error(f"no reasoning: turn {number} has no {think_end!r} closing its reasoning", "text")
        following = source.find(think_start, end + len(think_end), too_large) if think_start else -1
        if following < 0:
            while source.fill():
                if len(source.text) - source.pos > source.limit:
                    raise too_large()
            if len(source.text) - source.pos > source.limit:
                raise too_large()
        text, position = source.text, source.pos
        end += position
        stop = position + following if following >= 0 else len(text)
        head = text[position:end]
        opened = head.lstrip()
        start = position + (len(head) - len(opened))
        if think_start and opened.startswith(think_start):
            start += len(think_start)
        else:
            start = position
        reasoning = text[start:end]
        if not reasoning.strip():
            raise place.error(f"no reasoning: turn {number} has nothing before {think_end!r}", "text")
        final = text[end:stop]
        if following >= 0:
            final = final.rstrip() + "\n"
        turns.append(_Turn(place, reasoning, final, settings.prompt, "text"))
        source.pos = stop
    if not turns:
        raise TraceImportError(f"{path}, line 1: empty: no reasoning to import")
    return turns


def _decoded(data: bytes, path: Path) -> str:
    """A small file's text: UTF-8, a byte-order mark dropped, CRLF read as LF."""
    try:
        return data.decode("utf-8-sig").replace("\r\n", "\n")
    except UnicodeDecodeError as exc:
        skipped = 3 if data.startswith(codecs.BOM_UTF8) else 0
        raise TraceImportError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start + skipped})") from None


def _read_file(path: Path) -> str:
    try:
        return _decoded(path.read_bytes(), path)
    except FileNotFoundError:
        raise TraceImportError(f"{path}: does not exist") from None
    except OSError as exc:
        raise TraceImportError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def read_turns(path: Path, settings: _Settings) -> list[_Turn]:
    """The turns of one input file, read a block at a time (see `_Text`)."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise TraceImportError(f"{path}: does not exist") from None
    except OSError as exc:
        raise TraceImportError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    with handle:
        source = _Text(str(path), handle, settings.max_record_chars)
        lead = source.lead()
        if not lead:
            raise TraceImportError(f"{path}, line 1: empty: nothing to import")
        if _is_json(lead):
            return _json_turns(source, settings)
        turns = _plain_text_turns(source, settings)
    for turn in turns:
        turn.unit = 0                 # a plain-text file is one conversation: its turns in order
    return turns


# -- problems --------------------------------------------------------------------------------------


def _normalized(source: str) -> str:
    return "".join(source.split())


def _without_docstring(source: str) -> str | None:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines = source.splitlines(keepends=True)
        return "".join(lines[first.end_lineno:])
    return None


def _is_complete(source: str) -> bool:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    names = {node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    return {"Model", "get_inputs", "get_init_inputs"} <= names


@dataclass
class _Problem:
    name: str
    path: Path
    bundled: bool


class _ProblemIndex:
    def __init__(self, dirs: Sequence[Path]) -> None:
        from specgen.traces.bundled import bundled_problems

        self.by_name: dict[str, _Problem] = {}
        for name, path in bundled_problems().items():
            self.by_name[name] = _Problem(name, path, True)
        for directory in dirs:
            if not directory.is_dir():
                raise TraceImportError(f"--problems {directory}: not a directory")
            for path in sorted(directory.glob("*.py")):
                if not path.name.startswith("_"):
                    self.by_name[path.stem] = _Problem(path.stem, path, False)
        self.by_source: dict[str, str] = {}
        self.variants: list[tuple[str, str]] = []          # (normalized text, name), for substring search
        for name, problem in self.by_name.items():
            try:
                source = problem.path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise TraceImportError(f"problem file {problem.path}: cannot be read ({exc})") from None
            for variant in (source, _without_docstring(source)):
                if variant and variant.strip():
                    key = _normalized(variant)
                    self.by_source.setdefault(key, name)
                    self.variants.append((key, name))
        self._cache: dict[str, tuple[str | None, str | None]] = {}

    def match(self, source: str) -> str | None:
        for variant in (source, _without_docstring(source)):
            if variant:
                name = self.by_source.get(_normalized(variant))
                if name is not None:
                    return name
        return None

    def recover(self, texts: list[str]) -> tuple[str | None, str | None]:
        """(matched problem name, or None; the last complete embedded source, or None)."""
        key = "\x00".join(texts)
        if key not in self._cache:
            self._cache[key] = self._recover(texts)
        return self._cache[key]

    def _recover(self, texts: list[str]) -> tuple[str | None, str | None]:
        candidates = [source for text in texts for source in embedded_sources(text)]
        matched = [name for name in (self.match(source) for source in candidates) if name]
        if matched:
            return matched[-1], None          # the last: a prompt's example comes before its task
        best: tuple[int, int, str] | None = None
        for text in texts:
            flat = _normalized(text)
            for variant, name in self.variants:
                if len(variant) < 40:
                    continue
                found = flat.rfind(variant)
                if found >= 0 and (best is None or (found, len(variant)) > best[:2]):
                    best = (found, len(variant), name)
        if best is not None:
            return best[2], None
        complete = [source for source in candidates if _is_complete(source)]
        return None, (complete[-1] if complete else None)


def embedded_sources(text: str) -> list[str]:
    """The `class Model` programs a prompt embeds: fenced code blocks defining Model (and not
    ModelNew), else the stretch of raw text around a `class Model` line that parses as Python."""
    from specgen.traces.extraction import defines_model_new, find_code_blocks

    sources = [block.source for block in find_code_blocks(text)
               if _CLASS_MODEL.search(block.source) and not defines_model_new(block.source)]
    if sources:
        return sources
    lines = text.splitlines(keepends=True)
    found = []
    for index, line in enumerate(lines):
        if _CLASS_MODEL.match(line):
            source = _raw_program(lines, index)
            if source is not None:
                found.append(source)
    return found


_CODE_LINE = re.compile(
    r"^(\s|$|#|@|import\s|from\s|def\s|class\s|if\s|for\s|while\s|with\s|try:|except|else:|elif\s|"
    r"return\b|\"\"\"|'''|[)\]}]|[A-Za-z_][\w.]*\s*(\[[^\]]*\])?\s*(:[^=]*)?=[^=]|[A-Za-z_][\w.]*\()")


def _raw_program(lines: list[str], class_line: int, max_tries: int = 400) -> str | None:
    start = class_line
    while start > 0 and _CODE_LINE.match(lines[start - 1]):
        start -= 1
    end = class_line + 1
    while end < len(lines) and _CODE_LINE.match(lines[end]):
        end += 1
    tries = 0
    for first in range(start, class_line + 1):
        for last in range(end, class_line, -1):
            tries += 1
            if tries > max_tries:
                return None
            source = "".join(lines[first:last]).strip("\n") + "\n"
            try:
                ast.parse(source)
            except SyntaxError:
                continue
            return source
    return None


def _problem_hash_name(source: str) -> str:
    return "imported_" + hashlib.sha256(_normalized(source).encode("utf-8")).hexdigest()[:10]


@dataclass
class _Resolved:
    name: str
    write_source: str | None       # a program to write beside the trace as <name>.py


def _resolve_problem(turn: _Turn, index: _ProblemIndex, default_problem: str | None) -> _Resolved:
    place = turn.place
    messages = turn.messages or []
    user_texts = [m["content"] for m in messages if m["role"] == "user"] or [m["content"] for m in messages]
    name, field_name = turn.problem, turn.problem_field
    if name is None and default_problem is not None:
        name, field_name = default_problem, "problem (--problem)"
    if name is not None:
        if not _NAME.match(name) or any(part in (".", "..") for part in name.split("/")):
            raise place.error(f"problem name {name!r} must be letters, digits, '_', '.', '-' (parts split by '/')",
                              field_name)
        known = index.by_name.get(name)
        if known is not None:
            return _Resolved(name, None if known.bundled else known.path.read_text(encoding="utf-8"))
        _, source = index.recover(user_texts) if user_texts else (None, None)
        if source is None:
            raise place.error(
                f"unknown problem {name!r}: not bundled, not in --problems, and the prompt embeds no "
                "complete class Model source (class Model, get_inputs, get_init_inputs) to write beside "
                "the trace", field_name)
        return _Resolved(name, source)
    if turn.messages is None:
        raise place.error(
            "unknown problem: the record names none (problem, problem_name, metadata.problem) and has no "
            "prompt to recover it from; give --problem NAME or --prompt FILE", "messages")
    matched, source = index.recover(user_texts)
    if matched is not None:
        known = index.by_name[matched]
        return _Resolved(matched, None if known.bundled else known.path.read_text(encoding="utf-8"))
    if source is None:
        raise place.error(
            "unknown problem: no bundled problem (or --problems file) matches the prompt, and it embeds "
            "no complete class Model source (class Model, get_inputs, get_init_inputs)", "messages")
    return _Resolved(_problem_hash_name(source), source)


# -- tokens ----------------------------------------------------------------------------------------


class _Pieces:
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


class _HFTokens:
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


def _segment(text: str, tokens: Any, start_index: int, timing: _Timeline | None, rate: float | None,
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


# -- the import ------------------------------------------------------------------------------------


@dataclass
class ImportedTrace:
    path: Path                     # the trace file written
    problem: str
    turns: int
    timing: str
    problem_source: Path | None    # the problem program written beside it, if any
    sample: str | None = None      # which of the problem's traces, when it has several


class TraceImportWarning(UserWarning):
    """Something in the input that was imported with care (duplicates); the import went on."""


class ImportInterrupted(BaseException):
    """SIGTERM arrived during an import. Raised where the import was, so that it removes what it
    wrote; a BaseException, as KeyboardInterrupt is, so that handlers of errors let it through."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


class _Interrupts:
    """While an import runs SIGTERM raises `ImportInterrupted` (SIGINT raises KeyboardInterrupt, as
    always), so that the import removes its staging folder and undoes its moves instead of dying
    with them in `--out`. While it undoes them, and once its files are in place, signals wait:
    in the first case they are raised when the undoing is done, in the second they are delivered
    again, to the handlers of before, when the import returns. Handlers can be set only in the main
    thread; elsewhere signals are left as they are."""

    def __init__(self) -> None:
        self._active = threading.current_thread() is threading.main_thread()
        self._previous: dict[int, Any] = {}
        self._holding = 0
        self._committed = False
        self._pending: int | None = None

    def __enter__(self) -> "_Interrupts":
        if self._active:
            self._install(signal.SIGTERM, lambda previous: previous is not signal.SIG_IGN and previous is not None)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for signum, previous in reversed(list(self._previous.items())):
            signal.signal(signum, previous)
        self._previous.clear()
        pending, self._pending = self._pending, None
        if pending is not None and self._committed:
            signal.raise_signal(pending)

    def _install(self, signum: int, wanted: Callable[[Any], bool]) -> None:
        previous = signal.getsignal(signum)
        if signum not in self._previous and wanted(previous):
            self._previous[signum] = previous
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self._holding:
            self._pending = self._pending or signum
            return
        self._raise(signum)

    @staticmethod
    def _raise(signum: int) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise ImportInterrupted(signum)

    def _hold(self) -> None:
        self._holding += 1
        if self._active and self._holding == 1:
            # Only Python's own SIGINT handler is stood in for: a program's own, or SIG_IGN, stays.
            self._install(signal.SIGINT, lambda previous: previous is signal.default_int_handler)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Signals wait until the block is done, then are raised (a signal wins over an error)."""
        self._hold()
        try:
            yield
        finally:
            self._holding -= 1
            if not self._holding and not self._committed:
                if signal.SIGINT in self._previous:
                    signal.signal(signal.SIGINT, self._previous.pop(signal.SIGINT))
                pending, self._pending = self._pending, None
                if pending is not None:
                    self._raise(pending)

    def commit(self) -> None:
        """The files are in place: from now on a signal waits until the import returns."""
        self._hold()
        self._committed = True


def _safe_file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "__", name).strip(".") or "problem"


def _iso(epoch: float | None) -> str:
    moment = (_datetime.datetime.fromtimestamp(epoch, _datetime.timezone.utc) if epoch is not None
              and 0 < epoch < 1e11 else _datetime.datetime.now(_datetime.timezone.utc))
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def import_traces(
    paths: Iterable[str | Path],
    out_dir: str | Path,
    *,
    tokens_per_s: float | None = None,
    tokenizer: str | Path | None = None,
    prompt: str | Path | None = None,
    problem: str | None = None,
    problems_dirs: Sequence[str | Path] = (),
    model: str | None = None,
    think_end: str = "</think>",
    ttft_s: float = 0.5,
    force: bool = False,
    max_record_mb: float = MAX_RECORD_MB,
    on_warning: Callable[[str], None] | None = None,
) -> list[Path]:
    """Import reasoning logs into trace files under `out_dir` (one per conversation; see the module
    docstring); returns their paths.

    Args:
        paths: input files (see the module docstring for the formats).
        out_dir: where the traces (and the problem programs they need) go; created if missing.
        tokens_per_s: the token rate for turns without arrival times (required when there are any).
        tokenizer: a local Hugging Face tokenizer directory (default: a piece vocabulary).
        prompt: a file holding the user prompt, for turns that carry no chat (plain text).
        problem: the problem's name for turns that name none.
        problems_dirs: directories of KernelBench-format problems to match prompts against.
        model: the model's name for the metadata (default: the records' `model` field).
        think_end: the tag that closes the reasoning.
        ttft_s: seconds from the request to the first token under rate timing.
        force: replace trace files that already exist in `out_dir`.
        max_record_mb: the most text one record may hold (a JSON value, a stream's text, a
            plain-text turn), in MB (10^6 characters); a larger one stops the import.
        on_warning: called with each warning line (duplicates); default: `warnings.warn` with a
            `TraceImportWarning`.
    """
    return [item.path for item in import_traces_detailed(
        paths, out_dir, tokens_per_s=tokens_per_s, tokenizer=tokenizer, prompt=prompt, problem=problem,
        problems_dirs=problems_dirs, model=model, think_end=think_end, ttft_s=ttft_s, force=force,
        max_record_mb=max_record_mb, on_warning=on_warning, _caller_depth=2)]


def import_traces_detailed(
    paths: Iterable[str | Path],
    out_dir: str | Path,
    *,
    tokens_per_s: float | None = None,
    tokenizer: str | Path | None = None,
    prompt: str | Path | None = None,
    problem: str | None = None,
    problems_dirs: Sequence[str | Path] = (),
    model: str | None = None,
    think_end: str = "</think>",
    ttft_s: float = 0.5,
    force: bool = False,
    max_record_mb: float = MAX_RECORD_MB,
    on_warning: Callable[[str], None] | None = None,
    _caller_depth: int = 1,
) -> list[ImportedTrace]:
    """`import_traces`, returning what was written for each trace."""
    with _Interrupts() as interrupts:
        return _import(
            [Path(p) for p in paths], Path(out_dir), tokens_per_s=tokens_per_s, tokenizer=tokenizer,
            prompt=prompt, problem=problem, problems_dirs=problems_dirs, model=model, think_end=think_end,
            ttft_s=ttft_s, force=force, max_record_mb=max_record_mb, interrupts=interrupts,
            warn=on_warning or _python_warnings(_caller_depth))


def _python_warnings(depth: int) -> Callable[[str], None]:
    """Warning lines as `TraceImportWarning`s, shown at the line that called the import."""
    return lambda line: warnings.warn(line, TraceImportWarning, stacklevel=depth + 4)


def _import(paths: list[Path], out_dir: Path, *, tokens_per_s: float | None, tokenizer: str | Path | None,
            prompt: str | Path | None, problem: str | None, problems_dirs: Sequence[str | Path],
            model: str | None, think_end: str, ttft_s: float, force: bool, max_record_mb: float,
            interrupts: _Interrupts, warn: Callable[[str], None]) -> list[ImportedTrace]:
    if not paths:
        raise TraceImportError("no input files given")
    if tokens_per_s is not None and not (math.isfinite(tokens_per_s) and tokens_per_s > 0):
        raise TraceImportError(f"--tokens-per-s must be > 0, got {tokens_per_s}")
    if not (math.isfinite(ttft_s) and ttft_s >= 0):
        raise TraceImportError(f"--ttft-s must be >= 0, got {ttft_s}")
    if not (math.isfinite(max_record_mb) and max_record_mb > 0):
        raise TraceImportError(f"--max-record-mb must be > 0, got {max_record_mb}")
    if not think_end:
        raise TraceImportError("--think-end must not be empty")
    prompt_messages = None
    if prompt is not None:
        prompt_messages = [{"role": "user", "content": _read_file(Path(prompt))}]
    settings = _Settings(think_end=think_end, think_start=_think_start(think_end), prompt=prompt_messages,
                         ttft_s=ttft_s, max_record_chars=max(1, int(max_record_mb * 1e6)))
    index = _ProblemIndex([Path(d) for d in problems_dirs])

    # Read everything first: nothing is written unless every input imports.
    records: list[_Record] = []
    sources: dict[str, str | None] = {}
    order = 0
    for path in paths:
        units: dict[tuple[int, str], _Record] = {}
        for turn in read_turns(path, settings):
            if turn.messages is None:
                turn.messages = prompt_messages
            turn.order = order
            order += 1
            resolved = _resolve_problem(turn, index, problem)
            unit = units.get((turn.unit, resolved.name))
            if unit is None:
                unit = units[(turn.unit, resolved.name)] = _Record(resolved.name, [])
                records.append(unit)
            unit.turns.append(turn)
            if sources.get(resolved.name) is None:
                sources[resolved.name] = resolved.write_source
    by_problem: dict[str, list[_Record]] = {}
    for record in _deduplicated(records, warn):
        by_problem.setdefault(record.problem, []).append(record)

    tokens_shared = _HFTokens(str(tokenizer)) if tokenizer is not None else None
    traces: list[tuple[str, str | None, Trace, str | None]] = []
    for name, problem_records in by_problem.items():
        conversations = _conversations(name, problem_records, think_end)
        for number, (key, turns) in enumerate(conversations):
            sample = None if len(conversations) == 1 else key if key is not None else str(number)
            trace = _trace(name, turns, tokens_shared, tokens_per_s=tokens_per_s, ttft_s=ttft_s, model=model,
                           think_end=think_end,
                           sample=None if sample is None else f"sample {sample} of {len(conversations)}")
            traces.append((name, sample, trace, sources.get(name)))
    return _write_all(out_dir, traces, force, interrupts)


def _trace(name: str, turns: list[_Turn], tokens_shared: "_HFTokens | None", *, tokens_per_s: float | None,
           ttft_s: float, model: str | None, think_end: str, sample: str | None) -> Trace:
    recorded = [turn for turn in turns if turn.reasoning_times is not None]
    timed_by_rate = [turn for turn in turns if turn.reasoning_times is None]
    if recorded and timed_by_rate:
        raise timed_by_rate[0].place.error(
            f"problem {name!r} mixes turns with arrival times ({recorded[0].place.file}, line "
            f"{recorded[0].place.line}) and turns without; import them separately", "t")
    if timed_by_rate and tokens_per_s is None:
        raise timed_by_rate[0].place.error(
            "no arrival times: this turn has no token timing, so give --tokens-per-s RATE (rate timing)",
            "t")
    timing = "recorded" if recorded else "rate"
    tokens = tokens_shared or _Pieces()
    iterations = []
    for turn in turns:
        reasoning = _segment(turn.reasoning, tokens, 0, turn.reasoning_times, tokens_per_s, ttft_s)
        final = _segment(turn.final, tokens, reasoning.num_tokens, turn.final_times, tokens_per_s, ttft_s)
        iterations.append(Iteration(reasoning=reasoning, final=final, forks=[],
                                    messages=[dict(m) for m in turn.messages] if turn.messages else None))
    models = list(dict.fromkeys(turn.model for turn in turns if turn.model))
    files = list(dict.fromkeys(turn.place.file for turn in turns))
    metadata = TraceMetadata(
        model=model or ", ".join(models) or "unknown",
        tokenizer=tokens.spec(),
        hand_written=False,
        problem=name,
        token_rate=float(tokens_per_s) if timing == "rate" else None,
        notes=f"imported by specgen trace import from {', '.join(files)}: "
              + (f"{sample}, " if sample else "") + f"{len(turns)} turn(s), "
              + ("arrival times as recorded" if timing == "recorded" else f"timed at {tokens_per_s:g} tokens/s"),
        think_end=think_end,
        created=_iso(next((turn.created for turn in turns if turn.created is not None), None)),
        timing=timing,
        imported_from=files,
    )
    vocab = list(tokens.vocab) if tokens.kind == PIECES_KIND else None
    return Trace(metadata=metadata, iterations=iterations, vocab=vocab)


# -- records, duplicates and conversations ---------------------------------------------------------


@dataclass
class _Record:
    """One unit of input and its problem: a record's turns (several for a conversation record),
    or a plain-text file's. Duplicates are found, and traces are grouped, by these."""
    problem: str
    turns: list[_Turn]

    @property
    def first(self) -> _Turn:
        return self.turns[0]

    def where(self) -> str:
        return f"{self.first.place.file}, line {self.first.place.line}"


def _content_key(record: _Record) -> str:
    digest = hashlib.sha256(record.problem.encode("utf-8"))
    for turn in record.turns:
        for part in (json.dumps(turn.messages, sort_keys=True), turn.reasoning, turn.final):
            digest.update(b"\x00" + part.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def _deduplicated(records: list[_Record], warn: Callable[[str], None]) -> list[_Record]:
    """The records less those identical to an earlier one (the same problem, chat, reasoning and
    answer: logged twice, or a file given twice), which would replay as one more sample; a warning
    line per kind, with counts, for those and for ids that repeat with other content."""
    kept: list[_Record] = []
    by_content: dict[str, _Record] = {}
    by_id: dict[str, _Record] = {}
    duplicates: list[tuple[_Record, _Record]] = []
    reused: list[tuple[_Record, _Record]] = []
    for record in records:
        key = _content_key(record)
        earlier = by_content.get(key)
        if earlier is not None:
            duplicates.append((record, earlier))
            continue
        by_content[key] = record
        kept.append(record)
        record_id = record.first.record_id
        if record_id is not None:
            if record_id in by_id:
                reused.append((record, by_id[record_id]))
            else:
                by_id[record_id] = record
    if duplicates:
        record, earlier = duplicates[0]
        warn(f"{len(duplicates)} duplicate record(s) skipped: the same problem, chat, reasoning and answer "
             f"as an earlier record (first: {record.where()}, the same as {earlier.where()})")
    if reused:
        record, earlier = reused[0]
        warn(f"{len(reused)} record(s) repeat the id of an earlier record with other content, imported as "
             f"records of their own (first: id {record.first.record_id!r} at {record.where()}, also at "
             f"{earlier.where()})")
    return kept


_MIN_QUOTED_CHARS = 40           # a code block shorter than this (white space dropped) proves nothing


def _code_keys(text: str) -> set[str]:
    from specgen.traces.extraction import find_code_blocks

    keys = (_normalized(block.source) for block in find_code_blocks(text) if block.closed)
    return {key for key in keys if len(key) >= _MIN_QUOTED_CHARS}


def _history_answer(content: str, think_end: str) -> str:
    """An assistant message of a chat history as an answer: without reasoning sent back with it."""
    cut = content.find(think_end)
    return _normalized(content[cut + len(think_end):] if cut >= 0 else content)


def _conversations(name: str, records: list[_Record], think_end: str) -> list[tuple[str | None, list[_Turn]]]:
    """The traces of one problem, each (its sample key or None, its turns in order).

    Independent samples of a problem are traces of their own: replayed as turns of one trace they
    would be iterations with feedback between them that no model saw. Turns are one conversation
    when the records say so: the turns of one record (a conversation) or of one plain-text file;
    records with the same sample field (`SAMPLE_KEYS`); records numbered by `TURN_KEYS`, each
    number once; or a record whose chat shows the last turn of an earlier conversation: its
    answer as an assistant message with a message after it (the feedback), or a code block of
    that answer, new to that turn's chat, quoted in a later prompt (a loop that starts each
    iteration afresh with the feedback and the best kernel so far).
    """
    keyed = [record for record in records if record.first.sample is not None]
    if keyed:
        if len(keyed) != len(records):
            plain = next(record for record in records if record.first.sample is None)
            raise plain.first.place.error(
                f"problem {name!r} has records with a sample field ({keyed[0].where()}, field "
                f"{keyed[0].first.sample_field}) and records without; give all of them one or none", "sample")
        groups: dict[str, list[_Turn]] = {}
        for record in records:
            groups.setdefault(record.first.sample, []).extend(record.turns)  # type: ignore[arg-type]
        return [(key, _ordered(name, turns)) for key, turns in groups.items()]
    numbered = [record for record in records if record.first.turn is not None]
    if numbered and len(numbered) != len(records):
        plain = next(record for record in records if record.first.turn is None)
        raise plain.first.place.error(
            f"problem {name!r} has turns with a turn number ({numbered[0].where()}) and turns without; "
            "number all of them or none", "turn")
    if numbered and len({record.first.turn for record in records}) == len(records):
        return [(None, _ordered(name, [turn for record in records for turn in record.turns]))]

    # Conversations from what the chats show, in turn order (numbers repeat: several conversations).
    sequence = sorted(records, key=lambda record: (record.first.turn, record.first.order)) if numbered else records
    lowest = sequence[0].first.turn
    traces: list[list[_Turn]] = []
    by_answer: dict[str, list[tuple[int, _Turn]]] = {}
    by_block: dict[str, list[tuple[int, _Turn]]] = {}

    def register(index: int) -> None:
        last = traces[index][-1]
        answer = _normalized(last.answer(think_end))
        if answer:
            by_answer.setdefault(answer, []).append((index, last))
        asked = set().union(*(_code_keys(m["content"]) for m in last.messages or []))
        for key in _code_keys(last.answer(think_end)) - asked:
            by_block.setdefault(key, []).append((index, last))

    for record in sequence:
        first = record.first
        target: int | None = None
        if not numbered or first.turn != lowest:
            messages = first.messages or []
            found = [entry for message in messages[:-1] if message["role"] == "assistant"
                     for entry in by_answer.get(_history_answer(message["content"], think_end), [])]
            found += [entry for message in messages if message["role"] != "assistant"
                      for key in _code_keys(message["content"]) for entry in by_block.get(key, [])]
            live = [(index, last) for index, last in found if traces[index][-1] is last
                    and (not numbered or last.turn < first.turn)]  # type: ignore[operator]
            if live:
                target = max(live, key=lambda entry: entry[1].order)[0]
        if target is None:
            if numbered and first.turn != lowest:
                raise first.place.error(
                    f"problem {name!r} has several records numbered {first.turn}, and this one's chat shows "
                    f"none of the answers of the turns before it, so which conversation it continues is "
                    f"unknown; give each record a sample field ({', '.join(SAMPLE_KEYS)})", "turn")
            traces.append(list(record.turns))
            register(len(traces) - 1)
        else:
            traces[target].extend(record.turns)
            register(target)
    return [(None, turns) for turns in traces]


def _ordered(name: str, turns: list[_Turn]) -> list[_Turn]:
    numbered = [turn for turn in turns if turn.turn is not None]
    if not numbered:
        return sorted(turns, key=lambda turn: turn.order)
    if len(numbered) != len(turns):
        plain = next(turn for turn in turns if turn.turn is None)
        raise plain.place.error(
            f"problem {name!r} has turns with a turn number ({numbered[0].place.file}, line "
            f"{numbered[0].place.line}) and turns without; number all of them or none", "turn")
    seen: dict[int, _Turn] = {}
    for turn in numbered:
        if turn.turn in seen:
            first = seen[turn.turn]  # type: ignore[index]
            raise turn.place.error(
                f"problem {name!r} has turn {turn.turn} twice (also {first.place.file}, line {first.place.line})",
                "turn")
        seen[turn.turn] = turn  # type: ignore[index]
    return sorted(numbered, key=lambda turn: (turn.turn, turn.order))


def _write_all(out_dir: Path, traces: list[tuple[str, str | None, Trace, str | None]], force: bool,
               interrupts: _Interrupts) -> list[ImportedTrace]:
    """Write into a temporary directory inside `out_dir`, then move into place; undo on error and
    on a signal (see `_Interrupts`)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise TraceImportError(f"--out {out_dir}: exists and is not a directory")
    created = out_dir if not out_dir.exists() else None     # the topmost directory this call creates
    while created is not None and not created.parent.exists():
        created = created.parent
    staging: Path | None = None
    moved: list[tuple[Path, Path | None]] = []        # (target, backup of what it replaced)
    made_dirs: list[Path] = []
    try:
        with interrupts.held():                       # created and known here, or not created
            try:
                out_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise TraceImportError(f"--out {out_dir}: cannot be created ({exc.strerror or exc})") from None
            staging = Path(tempfile.mkdtemp(prefix=".trace-import-", dir=out_dir))
        plan: list[tuple[Path, Path]] = []            # (staged file, target)
        results: list[ImportedTrace] = []
        used: set[str] = set()
        source_targets: dict[str, Path] = {}
        for number, (name, sample, trace, source) in enumerate(traces):
            file_name = _safe_file_name(name) + ("" if sample is None else "." + _safe_file_name(sample))
            while file_name in used:
                file_name += "_"
            used.add(file_name)
            staged = staging / f"{number}{TRACE_SUFFIX}"
            trace.save(staged)
            target = out_dir / f"{file_name}{TRACE_SUFFIX}"
            plan.append((staged, target))
            source_target = source_targets.get(name)
            if source is not None and source_target is None:
                source_target = source_targets[name] = out_dir / f"{name}.py"
                staged_source = staging / f"{number}.py"
                staged_source.write_text(source if source.endswith("\n") else source + "\n", encoding="utf-8")
                plan.append((staged_source, source_target))
            results.append(ImportedTrace(path=target, problem=name, turns=len(trace.iterations),
                                         timing=trace.metadata.timing, problem_source=source_target,
                                         sample=sample))
        for staged, target in plan:
            if target.exists() and not force:
                if target.suffix == ".py" and target.read_bytes() == staged.read_bytes():
                    continue
                raise TraceImportError(f"--out {out_dir}: {target.name} exists (--force replaces it)")
        for number, (staged, target) in enumerate(plan):
            if target.exists() and target.suffix == ".py" and target.read_bytes() == staged.read_bytes():
                continue
            missing = []
            parent = target.parent
            while not parent.exists():
                missing.append(parent)
                parent = parent.parent
            target.parent.mkdir(parents=True, exist_ok=True)
            made_dirs.extend(reversed(missing))
            backup = None
            if target.exists():
                backup = staging / f"replaced-{number}"
                os.replace(target, backup)
            moved.append((target, backup))
            os.replace(staged, target)
        interrupts.commit()
        return results
    except BaseException as exc:
        with interrupts.held():
            for target, backup in reversed(moved):
                try:
                    if target.exists():
                        target.unlink()
                    if backup is not None:
                        os.replace(backup, target)
                except OSError:
                    pass
            for directory in reversed(made_dirs):
                try:
                    directory.rmdir()
                except OSError:
                    pass
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
        if isinstance(exc, OSError):
            raise TraceImportError(f"--out {out_dir}: cannot write ({exc.strerror or exc})") from exc
        raise
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
