"""Grouping records into traces: duplicates dropped (a warning line per kind), and the
records of one problem split into conversations, each a trace of its own with its turns in order
(the package docstring, "Conversations", has the rules).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Callable

from specgen.traces.importing.fields import SAMPLE_KEYS
from specgen.traces.importing.problems import normalized
from specgen.traces.importing.turns import Turn

_MIN_QUOTED_CHARS = 40           # a code block shorter than this (white space dropped) proves nothing


@dataclass
class Record:
    """One unit of input and its problem: a record's turns (several for a conversation record),
    or a plain-text file's. Duplicates are found, and traces are grouped, by these."""
    problem: str
    turns: list[Turn]

    @property
    def first(self) -> Turn:
        return self.turns[0]

    def where(self) -> str:
        return f"{self.first.place.file}, line {self.first.place.line}"


def _content_key(record: Record) -> str:
    digest = hashlib.sha256(record.problem.encode("utf-8"))
    for turn in record.turns:
        for part in (json.dumps(turn.messages, sort_keys=True), turn.reasoning, turn.final):
            digest.update(b"\x00" + part.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def deduplicated(records: list[Record], warn: Callable[[str], None]) -> list[Record]:
    """The records less those identical to an earlier one (the same problem, chat, reasoning and
    answer: logged twice, or a file given twice), which would replay as one more sample; a warning
    line per kind, with counts, for those and for ids that repeat with other content."""
    kept: list[Record] = []
    by_content: dict[str, Record] = {}
    by_id: dict[str, Record] = {}
    duplicates: list[tuple[Record, Record]] = []
    reused: list[tuple[Record, Record]] = []
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


def _code_keys(text: str) -> set[str]:
    from specgen.traces.extraction import find_code_blocks

    keys = (normalized(block.source) for block in find_code_blocks(text) if block.closed)
    return {key for key in keys if len(key) >= _MIN_QUOTED_CHARS}


def _history_answer(content: str, think_end: str) -> str:
    """An assistant message of a chat history as an answer: without reasoning sent back with it."""
    cut = content.find(think_end)
    return normalized(content[cut + len(think_end):] if cut >= 0 else content)


def group_conversations(name: str, records: list[Record],
                        think_end: str) -> list[tuple[str | None, list[Turn]]]:
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
        groups: dict[str, list[Turn]] = {}
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
    traces: list[list[Turn]] = []
    by_answer: dict[str, list[tuple[int, Turn]]] = {}
    by_block: dict[str, list[tuple[int, Turn]]] = {}

    def register(index: int) -> None:
        last = traces[index][-1]
        answer = normalized(last.answer(think_end))
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


def _ordered(name: str, turns: list[Turn]) -> list[Turn]:
    numbered = [turn for turn in turns if turn.turn is not None]
    if not numbered:
        return sorted(turns, key=lambda turn: turn.order)
    if len(numbered) != len(turns):
        plain = next(turn for turn in turns if turn.turn is None)
        raise plain.place.error(
            f"problem {name!r} has turns with a turn number ({numbered[0].place.file}, line "
            f"{numbered[0].place.line}) and turns without; number all of them or none", "turn")
    seen: dict[int, Turn] = {}
    for turn in numbered:
        if turn.turn in seen:
            first = seen[turn.turn]  # type: ignore[index]
            raise turn.place.error(
                f"problem {name!r} has turn {turn.turn} twice (also {first.place.file}, line {first.place.line})",
                "turn")
        seen[turn.turn] = turn  # type: ignore[index]
    return sorted(numbered, key=lambda turn: (turn.turn, turn.order))
