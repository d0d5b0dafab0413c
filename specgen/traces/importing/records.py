"""The turns of one input file: chat-completion records, request/response pairs, conversation
records, streams of chunks (a request line opens each), or plain text with think tags; which kind
a file is, its content tells.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from specgen.traces.importing.fields import (
    FIELD_KEYS,
    as_dict,
    chat_messages,
    content_text,
    metadata_containers,
    read_turn_fields,
    string_value,
    time_field,
)
from specgen.traces.importing.streams import Stream, finish_stream, read_stream_chunk, stream_chunk_of
from specgen.traces.importing.text import Text, is_json, json_values, megabytes
from specgen.traces.importing.turns import (
    Place,
    Settings,
    TraceImportError,
    Turn,
    join_field,
    reasoning_turn,
    split_think,
)


def _completion_turns(place: Place, record: dict[str, Any], settings: Settings) -> list[Turn] | None:
    """Turns of a non-stream record, or None when the record is a request (a stream opener)."""
    request = as_dict(record.get("request"))
    request_prefix = "request"
    if request is not None and as_dict(request.get("body")) is not None:
        request, request_prefix = request["body"], "request.body"
    response: dict[str, Any] | None = None
    response_prefix = ""
    text_value: tuple[str, str] | None = None
    for key in ("response", "completion", "output"):
        value = record.get(key)
        if isinstance(value, dict):
            response, response_prefix = value, key
            if as_dict(value.get("body")) is not None:
                response, response_prefix = value["body"], f"{key}.body"
            break
    if response is None and isinstance(record.get("choices"), list):
        response = record
    for key in ("text", "output", "completion", "response"):
        if text_value is None and isinstance(record.get(key), str):
            text_value = (record[key], key)
    messages: list[dict[str, str]] | None = None
    if request is not None and "messages" in request:
        messages = chat_messages(place, request["messages"], f"{request_prefix}.messages")
    elif "messages" in record:
        messages = chat_messages(place, record["messages"], "messages")
    else:
        for prefix, container in ((request_prefix, request), ("", record)):
            if container is not None and isinstance(container.get("prompt"), str):
                messages = [{"role": "user", "content": container["prompt"]}]
                break
    containers = (metadata_containers("", record) + metadata_containers(request_prefix, request)
                  + ([(response_prefix, response)] if response is not None and response is not record else []))
    if response is not None:
        choices = response.get("choices")
        where = join_field(response_prefix, "choices")
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
            reasoning = string_value(place, message.get(reasoning_key), f"{message_where}.{reasoning_key}")
            answer = content_text(place, message.get("content"), f"{message_where}.content")
            reasoning, final, _, _ = reasoning_turn(
                place, reasoning, answer, settings=settings, reasoning_field=f"{message_where}.{reasoning_key}")
            turn = Turn(place, reasoning, final, messages, f"{message_where}.{reasoning_key}")
        else:
            text = string_value(place, choice.get("text"), f"{where}[0].text") or ""
            turn = _text_turn(place, text, f"{where}[0].text", messages, settings)
        # The response names the model that ran (a request may name an alias).
        read_turn_fields(turn, [(response_prefix, response)] + containers)
        return [turn]
    if text_value is not None:
        turn = _text_turn(place, text_value[0], text_value[1], messages, settings)
        read_turn_fields(turn, containers)
        return [turn]
    if messages is not None and "messages" in record and request is None:
        turns = _conversation_turns(place, record["messages"], settings)
        if turns:
            for turn in turns:
                read_turn_fields(turn, containers)
                turn.turn = None      # a conversation's turns are numbered by their order in it
            return turns
    if messages is not None or request is not None:
        return None
    raise place.error(
        "not an importable record: expected a chat completion ('choices' with a 'message'), a "
        "stream chunk ('choices' with a 'delta'), a 'request'/'response' pair, 'messages' with a "
        "'text', or a conversation whose assistant messages carry reasoning", "choices")


def _text_turn(place: Place, text: str, field_name: str, messages: list[dict[str, str]] | None,
               settings: Settings) -> Turn:
    split = split_think(text, settings)
    if split is None or not text[split[0]:split[1]].strip():
        raise place.error(f"no reasoning: the text holds no {settings.think_end!r} after a reasoning",
                          field_name)
    start, end = split
    return Turn(place, text[start:end], text[end:], messages, field_name)


def _conversation_turns(place: Place, raw_messages: list[Any], settings: Settings) -> list[Turn]:
    turns = []
    history: list[dict[str, str]] = []
    for index, message in enumerate(raw_messages):
        where = f"messages[{index}]"
        role = message["role"]
        content = content_text(place, message.get("content"), f"{where}.content")
        if role == "assistant":
            key = "reasoning_content" if "reasoning_content" in message else "reasoning"
            reasoning = string_value(place, message.get(key), f"{where}.{key}")
            has_tags = settings.think_end in content
            if (reasoning and reasoning.strip()) or has_tags:
                r, final, _, start = reasoning_turn(place, reasoning, content, settings=settings,
                                                    reasoning_field=f"{where}.{key}")
                turns.append(Turn(place, r, final, [dict(m) for m in history], f"{where}.{key}"))
                if start >= 0:        # think tags in the content: the history keeps the answer only
                    content = final[len(settings.think_end):].lstrip("\n")
        history.append({"role": role, "content": content})
    return turns


def _json_turns(source: Text, settings: Settings) -> list[Turn]:
    path = source.path
    turns: list[Turn] = []
    stream: Stream | None = None
    stream_chars = 0
    units = 0

    def close() -> None:
        nonlocal stream, units
        if stream is not None:
            turn = finish_stream(stream, settings)
            turn.unit, units = units, units + 1
            turns.append(turn)
            stream = None

    for line, record in json_values(source):
        place = Place(path, line)
        if not isinstance(record, dict):
            raise place.error(f"a record must be a JSON object, got {type(record).__name__}")
        found = stream_chunk_of(record)
        if found is not None:
            prefix, chunk = found
            chunk_id = chunk.get("id")
            if stream is None or (stream.chunks and chunk_id is not None and stream.chunk_id is not None
                                  and chunk_id != stream.chunk_id):
                close()
                stream = Stream(place=place)
            if stream.chunk_id is None:
                stream.chunk_id = chunk_id
            if not stream.chunks or not FIELD_KEYS.isdisjoint(record) or not FIELD_KEYS.isdisjoint(chunk):
                stream.containers += metadata_containers("", record) + (
                    [(prefix, chunk)] if prefix else [])
            stream.delta_field = join_field(prefix, "choices[0].delta")
            piece = read_stream_chunk(place, record, prefix, chunk)
            stream_chars = (stream_chars if stream.chunks else 0) + len(piece.reasoning) + len(piece.content)
            if stream_chars > settings.max_record_chars:
                raise stream.place.error(
                    f"the stream that starts here holds more than {megabytes(settings.max_record_chars)} "
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
        request = as_dict(record.get("request"))
        stream = Stream(place=place)
        if request is not None and "messages" in request:
            stream.messages = chat_messages(place, request["messages"], "request.messages")
        elif "messages" in record:
            stream.messages = chat_messages(place, record["messages"], "messages")
        stream.containers = metadata_containers("", record) + metadata_containers("request", request)
        timed = time_field(place, [("", record)])
        stream.request_t = timed[0] if timed else None
    close()
    if not turns:
        raise TraceImportError(f"{path}, line 1: no records to import")
    return turns


def _plain_text_turns(source: Text, settings: Settings) -> list[Turn]:
    """The turns of a plain-text file, one at a time: a turn runs from one opening think tag to the
    next, and must stay within the limit per record."""
    path = source.path
    turns = []
    think_end, think_start = settings.think_end, settings.think_start
    while source.lead():              # something but white space is left
        line = source.line_at(source.pos)
        place = Place(path, line)
        number = len(turns) + 1

        def too_large() -> TraceImportError:
            return place.error(f"turn {number} is larger than {megabytes(source.limit)}, the limit per "
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
        turns.append(Turn(place, reasoning, final, settings.prompt, "text"))
        source.pos = stop
    if not turns:
        raise TraceImportError(f"{path}, line 1: empty: no reasoning to import")
    return turns


def read_turns(path: Path, settings: Settings) -> list[Turn]:
    """The turns of one input file, read a block at a time (see `Text`)."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise TraceImportError(f"{path}: does not exist") from None
    except OSError as exc:
        raise TraceImportError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    with handle:
        source = Text(str(path), handle, settings.max_record_chars)
        lead = source.lead()
        if not lead:
            raise TraceImportError(f"{path}, line 1: empty: nothing to import")
        if is_json(lead):
            return _json_turns(source, settings)
        turns = _plain_text_turns(source, settings)
    for turn in turns:
        turn.unit = 0                 # a plain-text file is one conversation: its turns in order
    return turns
