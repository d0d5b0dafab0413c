"""A checker for the Chrome Trace Event Format (the JSON object form), as the viewers read it."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

PHASES = {"X", "B", "E", "i", "I", "M", "C", "b", "e", "n"}


def load_chrome_trace(path: Path) -> list[dict[str, Any]]:
    """Parse `path` and check it event by event; returns the events. Raises AssertionError."""
    data = json.loads(Path(path).read_text())
    assert isinstance(data, dict) and isinstance(data.get("traceEvents"), list)
    assert data.get("displayTimeUnit", "ms") in ("ms", "ns")
    events = data["traceEvents"]
    spans: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    named_threads = set()
    for event in events:
        assert isinstance(event.get("name"), str), event
        assert event.get("ph") in PHASES, event
        assert isinstance(event.get("pid"), int), event
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "thread_name", "process_sort_index",
                                     "thread_sort_index"), event
            assert isinstance(event["args"]["name"], str)
            if event["name"] == "thread_name":
                named_threads.add((event["pid"], event["tid"]))
            continue
        assert isinstance(event.get("tid"), int), event
        assert isinstance(event.get("ts"), (int, float)) and event["ts"] >= 0, event
        if event["ph"] == "X":
            assert isinstance(event.get("dur"), (int, float)) and event["dur"] >= 0, event
            spans[(event["pid"], event["tid"])].append(
                (event["ts"], event["ts"] + event["dur"], event["name"]))
        if event["ph"] == "i":
            assert event.get("s", "t") in ("g", "p", "t"), event
        if "args" in event:
            assert isinstance(event["args"], dict)
    # Complete events on one row must nest (viewers mis-draw partial overlaps).
    for row, row_spans in spans.items():
        assert row in named_threads, f"row {row} has spans but no thread_name"
        row_spans.sort()
        stack: list[tuple[float, float, str]] = []
        for start, end, name in row_spans:
            while stack and stack[-1][1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1][1], f"{name} overlaps {stack[-1][2]} on {row}"
            stack.append((start, end, name))
    return events
