from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable

import pytest

from specgen.engines.base import EngineError
from specgen.errors import UsageError
from specgen.traces.format import SourceRecord, Trace, TraceBuilder, TraceFormatError

REASONING = (
    "The reference applies ReLU elementwise. A first kernel: one program per block of 1024 elements. "
    "FIRST_KERNEL_READY. Now, the loads could be vectorized and the grid made persistent. "
    "SECOND_KERNEL_READY. Checking the tail mask once more."
)


def _builder() -> TraceBuilder:
    builder = TraceBuilder(token_rate=50.0, problem="level1/19_ReLU", notes="test trace", ttft_s=0.4, fork_ttft_s=0.1)
    builder.add_iteration(
        REASONING,
        forks={"FIRST_KERNEL_READY.": "```python\nclass ModelNew: v1\n```", 5: "too early", "SECOND_KERNEL_READY.": "v2"},
        final_text="```python\nclass ModelNew: final\n```",
        messages=[{"role": "user", "content": "Make ReLU fast."}],
    )
    builder.add_iteration("Feedback says 1.3x. Try more warps.", forks={3: "v3"}, final_text="v4")
    return builder


def test_builder_places_forks_and_times_tokens(tmp_path: Path) -> None:
    trace = _builder().build()
    first = trace.iterations[0]
    assert first.reasoning.text == REASONING
    assert first.final.text.startswith("</think>\n\n") and first.final.text.endswith("final\n```")
    # A marker fork sits right after the marker: the reasoning text up to there ends with it.
    tokenizer = trace.tokenizer()
    positions = [fork.position for fork in first.forks]
    assert positions == sorted(positions) and positions[0] == 5
    marker_fork = first.forks[1]
    assert tokenizer.decode(first.reasoning.token_ids[: marker_fork.position]).endswith("FIRST_KERNEL_READY.")
    assert marker_fork.completion.text.startswith("```python")
    # Timing from the stated rate: first token at ttft, then 1/rate apart; final continues after.
    times = [chunk.t for chunk in first.reasoning.chunks]
    assert times[0] == pytest.approx(0.4)
    assert times[10] - times[9] == pytest.approx(1 / 50.0)
    assert first.final.chunks[0].t == pytest.approx(0.4 + first.reasoning.num_tokens / 50.0)
    assert first.forks[0].completion.chunks[0].t == pytest.approx(0.1)
    assert trace.metadata.hand_written is True and trace.metadata.token_rate == 50.0


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    trace = _builder().build()
    path = trace.save(tmp_path / "t.json")
    loaded = Trace.load(path)
    assert loaded.to_json() == trace.to_json()
    assert loaded.iterations[0].messages == [{"role": "user", "content": "Make ReLU fast."}]
    assert loaded.source == str(path)


def test_fork_at_takes_nearest_earlier_recording() -> None:
    iteration = _builder().build().iterations[0]
    first, second, third = (fork.position for fork in iteration.forks)
    assert iteration.fork_at(first - 1) is None
    assert iteration.fork_at(first).position == first
    assert iteration.fork_at(second - 1).position == first
    assert iteration.fork_at(10_000).position == third


def test_builder_with_a_model_tokenizer(tiny_model_path: str, tiny_tokenizer: Any, tmp_path: Path) -> None:
    builder = TraceBuilder(token_rate=30.0, problem="p", tokenizer=tiny_model_path)
    builder.add_iteration("Thinking about ünïcode ✓ kernels. READY.", forks={"READY.": "code"}, final_text="done")
    trace = builder.build()
    assert trace.vocab is None and trace.metadata.tokenizer == {"kind": "huggingface", "name_or_path": tiny_model_path}
    reasoning = trace.iterations[0].reasoning
    assert reasoning.text == "Thinking about ünïcode ✓ kernels. READY."
    assert reasoning.token_ids == tiny_tokenizer.encode(reasoning.text, add_special_tokens=False)
    assert Trace.load(trace.save(tmp_path / "hf.json")).to_json() == trace.to_json()


def test_builder_rejects_bad_input() -> None:
    builder = TraceBuilder(token_rate=10.0, problem="p")
    with pytest.raises(ValueError, match="marker 'NOPE'"):
        builder.add_iteration("some reasoning", forks={"NOPE": "x"}, final_text="f")
    with pytest.raises(ValueError, match="outside the reasoning"):
        builder.add_iteration("some reasoning", forks={999: "x"}, final_text="f")
    with pytest.raises(ValueError, match="must not contain"):
        builder.add_iteration("a </think> b", forks={}, final_text="f")
    with pytest.raises(ValueError, match="at least one iteration"):
        builder.build()
    with pytest.raises(ValueError, match="token_rate"):
        TraceBuilder(token_rate=0, problem="p")


def test_an_iterations_record_round_trips_and_traces_without_one_load_as_before(tmp_path: Path) -> None:
    trace = _builder().build()
    before = trace.save(tmp_path / "before.json").read_text()
    assert '"record"' not in before                     # not written unless known
    trace.iterations[0].record = SourceRecord("log.jsonl", 12, "req-17")
    trace.iterations[1].record = SourceRecord("answer.txt", 1)
    loaded = Trace.load(trace.save(tmp_path / "t.json"))
    assert loaded.iterations[0].record == SourceRecord("log.jsonl", 12, "req-17")
    assert loaded.iterations[1].record == SourceRecord("answer.txt", 1, None)
    assert loaded.to_json()["iterations"][1]["record"] == {"file": "answer.txt", "line": 1}
    assert Trace.load(tmp_path / "before.json").iterations[0].record is None


Mutation = Callable[[dict], None]


def _set(path: list[Any], value: Any) -> Mutation:
    def mutate(data: dict) -> None:
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return mutate


def _delete(path: list[Any]) -> Mutation:
    def mutate(data: dict) -> None:
        target = data
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    return mutate


MALFORMED: list[tuple[str, Mutation, str]] = [
    ("wrong format", _set(["format"], "other"), "field format"),
    ("future version", _set(["version"], 2), "field version"),
    ("no metadata model", _delete(["metadata", "model"]), "field metadata: missing 'model'"),
    ("unknown top field", _set(["extra"], 1), "unknown field(s) 'extra'"),
    ("hand-written without rate", _set(["metadata", "token_rate"], None), "field metadata.token_rate"),
    ("negative rate", _set(["metadata", "token_rate"], -3), "field metadata.token_rate"),
    ("bad tokenizer kind", _set(["metadata", "tokenizer", "kind"], "sentencepiece"), "field metadata.tokenizer.kind"),
    ("hand_written not bool", _set(["metadata", "hand_written"], "yes"), "field metadata.hand_written"),
    ("vocab missing", _delete(["vocab"]), "field vocab"),
    ("no iterations", _set(["iterations"], []), "field iterations"),
    ("chunk not triple", _set(["iterations", 0, "reasoning", "chunks", 3], [0.1, [1]]), "iterations[0].reasoning.chunks[3]"),
    ("time goes back", _set(["iterations", 0, "reasoning", "chunks", 3, 0], 0.0), "iterations[0].reasoning.chunks[3][0]"),
    ("id not int", _set(["iterations", 0, "reasoning", "chunks", 2, 1], [1.5]), "iterations[0].reasoning.chunks[2][1][0]"),
    ("id out of vocab", _set(["iterations", 0, "final", "chunks", 0, 1], [10 ** 6]), "outside the trace's vocabulary"),
    ("text not str", _set(["iterations", 1, "final", "chunks", 0, 2], 5), "iterations[1].final.chunks[0][2]"),
    ("fork beyond reasoning", _set(["iterations", 1, "forks", 0, "position"], 10 ** 6), "iterations[1].forks[0].position"),
    ("forks out of order", _set(["iterations", 0, "forks", 1, "position"], 1), "iterations[0].forks[1].position"),
    ("fork without completion", _delete(["iterations", 0, "forks", 0, "completion"]), "iterations[0].forks[0]: missing 'completion'"),
    ("bad message", _set(["iterations", 0, "messages", 0], {"role": "user"}), "iterations[0].messages[0]: missing 'content'"),
    ("record without line", _set(["iterations", 0, "record"], {"file": "log.jsonl"}),
     "iterations[0].record: missing 'line'"),
    ("record id not str", _set(["iterations", 0, "record"], {"file": "f", "line": 2, "id": 7}),
     "iterations[0].record.id"),
    ("record line zero", _set(["iterations", 0, "record"], {"file": "f", "line": 0}), "iterations[0].record.line"),
]


@pytest.mark.parametrize("name,mutate,expected", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_trace_names_file_and_field(tmp_path: Path, name: str, mutate: Mutation, expected: str) -> None:
    data = copy.deepcopy(_builder().build().to_json())
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TraceFormatError) as info:
        Trace.load(path)
    message = str(info.value)
    assert str(path) in message and expected in message
    # One error type serves both a job (EngineError) and the CLI (UsageError: one line, exit 2).
    assert isinstance(info.value, EngineError) and isinstance(info.value, UsageError)


def test_unreadable_trace_files(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="does not exist"):
        Trace.load(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": ')
    with pytest.raises(TraceFormatError, match=r"broken\.json.*not valid JSON"):
        Trace.load(broken)
