"""Streamed chunk logs: a stream's chunks read, their arrival times (explicit, or `created`
when it varies within the stream) put on the request's clock, and joined into one timed turn.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specgen.traces.importing.fields import as_dict, content_text, read_turn_fields, string_value, time_field
from specgen.traces.importing.turns import (
    Place,
    Settings,
    Timeline,
    Turn,
    join_field,
    reasoning_turn,
    timed_join,
)

_ABSOLUTE_TIME_S = 1e6           # times above this are clock times, not seconds since the request


@dataclass
class _StreamChunk:
    place: Place
    t: float | None
    t_field: str
    created: float | None
    reasoning: str
    content: str


@dataclass
class Stream:
    place: Place                          # where it began (its request line or first chunk)
    messages: list[dict[str, str]] | None = None
    request_t: float | None = None
    chunk_id: Any = None
    chunks: list[_StreamChunk] = field(default_factory=list)
    containers: list[tuple[str, dict[str, Any] | None]] = field(default_factory=list)
    delta_field: str = "choices[0].delta"


def stream_chunk_of(record: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(field path, chunk) when the record is a stream chunk (bare or wrapped)."""
    for key in ("chunk", "data"):
        inner = as_dict(record.get(key))
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


def read_stream_chunk(place: Place, record: dict[str, Any], prefix: str, chunk: dict[str, Any]) -> _StreamChunk:
    timed = time_field(place, [("", record)] + ([(prefix, chunk)] if prefix else []))
    created = chunk.get("created")
    created_t = None
    if created is not None and not isinstance(created, bool) and isinstance(created, (int, float)):
        created_t = float(created)
    reasoning_parts: list[str] = []
    content_parts: list[str] = []
    choices = chunk.get("choices")
    if choices is not None and not isinstance(choices, list):
        raise place.error(f"must be a list, got {type(choices).__name__}", join_field(prefix, "choices"))
    for index, choice in enumerate(choices or []):
        where = join_field(prefix, f"choices[{index}]")
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
            text = string_value(place, delta.get(key), f"{where}.delta.{key}")
            if text:
                reasoning_parts.append(text)
                break
        content_parts.append(content_text(place, delta.get("content"), f"{where}.delta.content"))
    return _StreamChunk(place=place, t=timed[0] if timed else None, t_field=timed[1] if timed else "t",
                        created=created_t, reasoning="".join(reasoning_parts), content="".join(content_parts))


def finish_stream(stream: Stream, settings: Settings) -> Turn:
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
    reasoning_text, reasoning_line = timed_join(reasoning_parts)
    answer, answer_line = timed_join(content_parts)
    reasoning, final, head, start = reasoning_turn(
        place, reasoning_text if reasoning_parts else None, answer, settings=settings,
        reasoning_field=f"{stream.delta_field}.reasoning_content")
    turn = Turn(place=place, reasoning=reasoning, final=final, messages=stream.messages,
                reasoning_field=f"{stream.delta_field}.reasoning_content")
    if times is not None:
        if start < 0:
            turn.reasoning_times = reasoning_line
            final_line = Timeline()
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
    read_turn_fields(turn, stream.containers)
    return turn
