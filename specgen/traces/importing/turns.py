"""One turn of imported reasoning, and where its reasoning ends and its answer begins.

A `Turn` is what every reader yields (a record's, a stream's, a plain-text file's): the reasoning,
the final segment from the think-end tag on, the chat it answered, its arrival times when the input
had any (`Timeline`), and the fields that name its problem, sample and turn. `Place` is where it
was read, so that every `TraceImportError` names the file, the line and the field.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from specgen.errors import UsageError

MAX_RECORD_MB = 8.0              # a real reasoning record is well under 1 MB; importing costs ~200x its text in memory


class TraceImportError(UsageError):
    """Input that cannot be imported; the message names the file, the line and the field."""


@dataclass(frozen=True)
class Place:
    file: str
    line: int

    def error(self, problem: str, field_name: str | None = None) -> TraceImportError:
        where = f"{self.file}, line {self.line}"
        if field_name:
            where += f", field {field_name}"
        return TraceImportError(f"{where}: {problem}")


def join_field(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


class Timeline:
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

    def slice(self, start: int, stop: int) -> "Timeline":
        part = Timeline()
        previous = 0
        for end, t in zip(self.ends, self.ts):
            lo, hi = max(previous, start), min(end, stop)
            if hi > lo:
                part.add(hi - lo, t)
            previous = end
            if end >= stop:
                break
        return part


def timed_join(parts: list[tuple[str, float]]) -> tuple[str, Timeline]:
    timeline = Timeline()
    for text, t in parts:
        timeline.add(len(text), t)
    return "".join(text for text, _ in parts), timeline


@dataclass
class Turn:
    place: Place
    reasoning: str
    final: str                             # from the think-end tag on; "" when no answer came
    messages: list[dict[str, str]] | None
    reasoning_field: str                   # where the reasoning was read, for errors
    problem: str | None = None
    problem_field: str = "problem"
    turn: int | None = None
    model: str | None = None
    created: float | None = None
    reasoning_times: Timeline | None = None   # None: rate timing
    final_times: Timeline | None = None
    order: int = 0                         # input order over all files
    unit: int = 0                          # turns of one unit (a record, a plain-text file) share it
    sample: str | None = None              # an explicit sample (conversation) key
    sample_field: str = "sample"
    record_id: str | None = None           # the record's own id (custom_id, id): duplicates, and kept
                                           # in the trace (Iteration.record)
    name: str | None = None                # the problem's own name in the record (fields.NAME_KEYS)

    def answer(self, think_end: str) -> str:
        """The answer without the think-end tag (as a chat history holds it)."""
        return (self.final[len(think_end):] if self.final.startswith(think_end) else self.final).strip()


@dataclass
class Settings:
    """What every reader of one import needs to know: the think tags, the prompt for inputs that
    carry no chat, the time to first token for absolute times, the limit per record."""

    think_end: str
    think_start: str
    prompt: list[dict[str, str]] | None
    ttft_s: float
    max_record_chars: int = int(MAX_RECORD_MB * 1e6)


def think_start_tag(think_end: str) -> str:
    return "<" + think_end[2:] if think_end.startswith("</") else ""


def _final_text(think_end: str, answer: str) -> tuple[str, int]:
    """The final segment for an answer read separately from the reasoning, and the length of the
    part before the answer."""
    if not answer:
        return "", 0
    head = think_end if answer[:1].isspace() else think_end + "\n\n"
    return head + answer, len(head)


def split_think(text: str, settings: Settings) -> tuple[int, int] | None:
    """(reasoning start, think-end offset) in `text`, or None when it holds no think-end tag."""
    end = text.find(settings.think_end)
    if end < 0:
        return None
    start = 0
    stripped = len(text) - len(text.lstrip())
    if settings.think_start and text.startswith(settings.think_start, stripped) and stripped + len(settings.think_start) <= end:
        start = stripped + len(settings.think_start)
    return start, end


def reasoning_turn(place: Place, reasoning: str | None, answer: str | None, *, reasoning_field: str,
                   settings: Settings) -> tuple[str, str, int, int]:
    """(reasoning, final, offset of the answer in final, offset of the reasoning in the answer-only
    text) from a message's reasoning and answer fields; think tags in the answer when there is no
    reasoning field. The last value is -1 when reasoning and answer were separate."""
    if reasoning is not None and reasoning.strip():
        if settings.think_end in reasoning:
            raise place.error(f"the reasoning holds the think-end tag {settings.think_end!r}", reasoning_field)
        final, head = _final_text(settings.think_end, answer or "")
        return reasoning, final, head, -1
    if answer:
        split = split_think(answer, settings)
        if split is not None:
            start, end = split
            if answer[start:end].strip():
                return answer[start:end], answer[end:], 0, start
    raise place.error(
        "no reasoning: the record has neither a reasoning field (reasoning_content, reasoning) nor "
        f"an answer holding {settings.think_end!r}", reasoning_field)
