"""The fields of a record that say what it is: messages and their content, the problem, turn
and sample fields, a record's own id, and arrival times (seconds or ISO-8601). Each reader checks
the field's type and names its path when it is wrong.
"""
from __future__ import annotations

import datetime as _datetime
import math
from typing import Any, Sequence

from specgen.traces.importing.turns import Place, Turn, join_field

TIME_KEYS = ("t", "time", "arrival_time", "arrival", "timestamp", "ts")
PROBLEM_KEYS = ("problem", "problem_name")
TURN_KEYS = ("turn", "iteration", "turn_index")
SAMPLE_KEYS = ("sample", "sample_id", "sample_index", "conversation_id")
ID_KEYS = ("custom_id", "id")
# A problem's own name, where a record carries one beside the source its prompt embeds (a
# dataset row's `name`, a KernelBench file name): what an unknown problem is named after instead
# of its source's hash (problems.py). Not a problem reference: a value of another type is ignored.
NAME_KEYS = ("name", "problem_file", "task_name")
FIELD_KEYS = frozenset((*PROBLEM_KEYS, *TURN_KEYS, *SAMPLE_KEYS, "metadata"))   # a chunk line may carry them


def as_dict(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def string_value(place: Place, value: Any, field_name: str, *, allow_none: bool = True) -> str | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, str):
        raise place.error(f"must be a string, got {type(value).__name__}", field_name)
    return value


def content_text(place: Place, value: Any, field_name: str) -> str:
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


def chat_messages(place: Place, value: Any, field_name: str) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise place.error(f"must be a list of messages, got {type(value).__name__}", field_name)
    messages = []
    for index, message in enumerate(value):
        where = f"{field_name}[{index}]"
        if not isinstance(message, dict):
            raise place.error(f"must be an object, got {type(message).__name__}", where)
        role = string_value(place, message.get("role"), f"{where}.role", allow_none=False)
        content = content_text(place, message.get("content"), f"{where}.content")
        messages.append({"role": role, "content": content})
    return messages


def _explicit(place: Place, containers: list[tuple[str, dict[str, Any] | None]], keys: Sequence[str]
              ) -> tuple[Any, str] | None:
    """The first of `keys` in the containers (each with its field path), and its field path."""
    for prefix, container in containers:
        if container is None:
            continue
        for key in keys:
            if key in container and container[key] is not None:
                return container[key], join_field(prefix, key)
    return None


def read_turn_fields(turn: Turn, containers: list[tuple[str, dict[str, Any] | None]]) -> None:
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
    if turn.name is None:
        turn.name = _name_hint(containers)
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


def _name_hint(containers: list[tuple[str, dict[str, Any] | None]]) -> str | None:
    for key in NAME_KEYS:
        for _, container in containers:
            value = container.get(key) if container is not None else None
            if isinstance(value, str) and value.strip():
                return value.strip()
    return None


def metadata_containers(prefix: str, record: dict[str, Any] | None) -> list[tuple[str, dict[str, Any] | None]]:
    if record is None:
        return []
    return [(prefix, record), (join_field(prefix, "metadata"), as_dict(record.get("metadata")))]


def _time_value(place: Place, value: Any, field_name: str) -> float:
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


def time_field(place: Place, containers: list[tuple[str, dict[str, Any] | None]]) -> tuple[float, str] | None:
    for prefix, container in containers:
        if container is None:
            continue
        for key in TIME_KEYS:
            if key in container and container[key] is not None:
                where = join_field(prefix, key)
                return _time_value(place, container[key], where), where
    return None
