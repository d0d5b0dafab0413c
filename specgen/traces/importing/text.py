"""Input files read a block at a time, and the JSON records in them.

`Text` holds about one record (and a block) however large the file is, and refuses a record over
the limit before the rest of it is read; `json_values` yields a file's records one at a time (a
top-level array's elements, JSON Lines, concatenated objects, SSE `data:` lines).
"""
from __future__ import annotations

import codecs
import json
import re
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from specgen.traces.importing.turns import TraceImportError

_WS = re.compile(r"[\s\ufeff]*")     # a byte-order mark where files were joined counts as space
_BLOCK_BYTES = 1 << 20
_CUT_ERROR_CHARS = 64                # a JSON error this close to the end of what was read may be a cut
_SSE_STARTS = frozenset("deir:")          # first letters of the SSE fields data:, event:, id:, retry:, and :


def megabytes(chars: int) -> str:
    return f"{chars / 1e6:g} MB"


class Text:
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
                raise TraceImportError(f"{self.path}, line 1: more than {megabytes(self.limit)} of white "
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


def json_values(source: Text) -> Iterator[tuple[int, Any]]:
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
                f"{path}, line {line}: record {ordinal} is larger than {megabytes(source.limit)}, the "
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
                                f"{megabytes(source.limit)}, the limit per record (--max-record-mb sets it)")

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


def is_json(lead: str) -> bool:
    return lead[:1] in ("{", "[") or lead.startswith("data:")


def _decoded(data: bytes, path: Path) -> str:
    """A small file's text: UTF-8, a byte-order mark dropped, CRLF read as LF."""
    try:
        return data.decode("utf-8-sig").replace("\r\n", "\n")
    except UnicodeDecodeError as exc:
        skipped = 3 if data.startswith(codecs.BOM_UTF8) else 0
        raise TraceImportError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start + skipped})") from None


def read_file(path: Path) -> str:
    try:
        return _decoded(path.read_bytes(), path)
    except FileNotFoundError:
        raise TraceImportError(f"{path}: does not exist") from None
    except OSError as exc:
        raise TraceImportError(f"{path}: cannot be read ({exc.strerror or exc})") from None
