from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest

from specgen.cli import main as cli_main
from specgen.engines.base import GenerationParams
from specgen.errors import UsageError
from specgen.traces.bundled import bundled_problems
from specgen.traces.format import Trace, TraceFormatError
from specgen.traces.importing import TraceImportError, TraceImportWarning, embedded_sources, import_traces
from specgen.traces.replay import ReplayEngine

SOFTMAX = bundled_problems()["softmax"].read_text()
LAYERNORM = bundled_problems()["layernorm"].read_text()
UNKNOWN = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """Scales its input by three."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * 3.0


def get_inputs():
    return [torch.randn(8, 8)]


def get_init_inputs():
    return []
'''
REASONING = ("Let me think about the softmax. Each row is independent, so one program per row.\n"
             "The row has 65536 elements; a two-pass online max/sum keeps it in registers.\n")
ANSWER = "```python\nclass ModelNew(nn.Module):\n    pass\n```\n"


def fenced_prompt(source: str) -> str:
    """The optimize loop's own kind of prompt: the problem in a fenced block."""
    return ("Here is a PyTorch program. Write a faster drop-in replacement.\n\n```python\n"
            + source.strip("\n") + "\n```\n\nAnswer with one complete ```python block.\n")


def raw_prompt(source: str) -> str:
    """A KernelBench-style prompt: an example architecture first, then the task, both unfenced."""
    example = ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
               "        super().__init__()\n\n    def forward(self, a, b):\n        return a + b\n\n\n"
               "def get_inputs():\n    return [torch.randn(1, 128), torch.randn(1, 128)]\n\n\n"
               "def get_init_inputs():\n    return []\n")
    return ("You write custom CUDA kernels to replace the pytorch operators in the given architecture.\n"
            "Here's an example to show you the syntax. The example given architecture is:\n\n"
            + example + "\nYou are given the following architecture:\n\n" + source
            + "\nOptimize the architecture named Model with custom CUDA operators! Name your optimized "
              "output architecture ModelNew.\n")


_IDS = itertools.count(1)


def completion(reasoning: str | None, content: str, model: str = "qwq-32b", **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return {"id": f"chatcmpl-{next(_IDS)}", "object": "chat.completion", "created": 1767225600, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}], **extra}


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def replayed(trace_path: Path, loop: Any) -> list[str]:
    """The text the replay engine streams for each iteration."""
    engine = ReplayEngine(trace_path, speed=float("inf"))
    prompt = engine.chat_prompt_ids([{"role": "user", "content": "x"}])

    async def run() -> list[str]:
        texts = []
        for index in range(len(engine.trace.iterations)):
            parts = [d.text async for d in engine.reason(f"r{index}", prompt, GenerationParams(max_tokens=10 ** 6))]
            texts.append("".join(parts))
        return texts

    return loop.run(run())


def files_under(directory: Path) -> list[str]:
    if not directory.exists():
        return []
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


# -- chat-completion responses ---------------------------------------------------------------------


def test_request_response_records_round_trip_with_rate_timing(tmp_path: Path, loop: Any) -> None:
    records = [
        {"request": {"model": "qwq", "messages": [{"role": "user", "content": fenced_prompt(SOFTMAX)}]},
         "response": completion(REASONING, ANSWER), "metadata": {"problem": "softmax", "turn": 0}},
        {"request": {"messages": [{"role": "user", "content": fenced_prompt(SOFTMAX) + "\nFaster."}]},
         "response": completion("Second turn: fewer passes.", "\n\nv2"), "metadata": {"problem": "softmax", "turn": 1}},
    ]
    source = write_jsonl(tmp_path / "responses.jsonl", records)
    [path] = import_traces([source], tmp_path / "out", tokens_per_s=50.0, ttft_s=0.25)
    assert path == tmp_path / "out" / "softmax.trace.json"
    trace = Trace.load(path)
    meta = trace.metadata
    assert meta.hand_written is False and meta.problem == "softmax" and meta.model == "qwq-32b"
    assert meta.timing == "rate" and meta.token_rate == 50.0 and meta.think_end == "</think>"
    assert meta.imported_from == [str(source)] and meta.tokenizer == {"kind": "specgen-pieces-v1"}
    assert meta.created == "2026-01-01T00:00:00Z"          # the response's `created`
    first, second = trace.iterations
    assert first.reasoning.text == REASONING and first.final.text == "</think>\n\n" + ANSWER
    assert second.final.text == "</think>\n\nv2"           # an answer opening with white space keeps it
    assert first.forks == [] and first.messages == records[0]["request"]["messages"]
    times = [chunk.t for chunk in first.reasoning.chunks]
    assert times[0] == pytest.approx(0.25) and times[1] - times[0] == pytest.approx(1 / 50.0)
    assert first.final.chunks[0].t == pytest.approx(0.25 + first.reasoning.num_tokens / 50.0)
    # About 3.6 characters a token, like a real tokenizer on this kind of text.
    assert 3.0 <= len(REASONING) / first.reasoning.num_tokens <= 4.2
    assert replayed(path, loop) == [REASONING + "</think>\n\n" + ANSWER, "Second turn: fewer passes.</think>\n\nv2"]


def test_json_array_of_bare_responses_recovers_the_problem_from_the_prompt(tmp_path: Path, loop: Any) -> None:
    # Bare responses with the chat beside them; `reasoning` read like `reasoning_content`.
    response = completion(None, ANSWER, messages=[{"role": "system", "content": "You are fast."},
                                                  {"role": "user", "content": fenced_prompt(LAYERNORM)}])
    response["choices"][0]["message"]["reasoning"] = REASONING
    source = tmp_path / "responses.json"
    source.write_text(json.dumps([response], indent=2))
    [path] = import_traces([source], tmp_path / "out", tokens_per_s=30.0)
    trace = Trace.load(path)
    assert trace.metadata.problem == "layernorm" and path.name == "layernorm.trace.json"
    assert files_under(tmp_path / "out") == ["layernorm.trace.json"]     # bundled: no program beside it
    assert replayed(path, loop) == [REASONING + "</think>\n\n" + ANSWER]


def test_conversation_record_gives_one_turn_per_reasoning_answer(tmp_path: Path) -> None:
    conversation = {"problem": "softmax", "model": "deepseek-r1", "messages": [
        {"role": "user", "content": "Make softmax fast."},
        {"role": "assistant", "reasoning_content": "First thoughts.", "content": "v1"},
        {"role": "user", "content": "1.2x. Faster."},
        {"role": "assistant", "content": "<think>\nSecond thoughts.\n</think>\n\nv2"},
    ]}
    [path] = import_traces([write_jsonl(tmp_path / "chat.jsonl", [conversation])], tmp_path / "out",
                           tokens_per_s=20.0)
    first, second = Trace.load(path).iterations
    assert first.reasoning.text == "First thoughts." and first.final.text == "</think>\n\nv1"
    assert first.messages == [{"role": "user", "content": "Make softmax fast."}]
    assert second.reasoning.text == "\nSecond thoughts.\n" and second.final.text == "</think>\n\nv2"
    # The history holds answers, not reasoning, as chat APIs send it back.
    assert second.messages[1] == {"role": "assistant", "content": "v1"}
    assert Trace.load(path).metadata.model == "deepseek-r1"


def test_content_with_think_tags_and_no_reasoning_field_is_split(tmp_path: Path) -> None:
    record = {"messages": [{"role": "user", "content": fenced_prompt(SOFTMAX)}],
              "response": completion(None, "<think>\n" + REASONING + "</think>\n\n" + ANSWER)}
    [path] = import_traces([write_jsonl(tmp_path / "r.jsonl", [record])], tmp_path / "out", tokens_per_s=40.0)
    iteration = Trace.load(path).iterations[0]
    assert iteration.reasoning.text == "\n" + REASONING and iteration.final.text == "</think>\n\n" + ANSWER


# -- plain text ------------------------------------------------------------------------------------


def test_plain_text_with_prompt_file(tmp_path: Path, loop: Any) -> None:
    prompt = tmp_path / "prompt.md"
    prompt.write_text(raw_prompt(SOFTMAX))
    text = tmp_path / "answer.txt"
    text.write_text("<think>\n" + REASONING + "</think>\n\n" + ANSWER
                    + "\n<think>\nTurn two.\n</think>\n\nv2\n")
    [path] = import_traces([text], tmp_path / "out", prompt=prompt, tokens_per_s=40.0)
    trace = Trace.load(path)
    assert trace.metadata.problem == "softmax" and trace.metadata.timing == "rate"
    first, second = trace.iterations
    assert first.reasoning.text == "\n" + REASONING and first.final.text == "</think>\n\n" + ANSWER
    assert second.reasoning.text == "\nTurn two.\n" and second.final.text == "</think>\n\nv2\n"
    assert first.messages == [{"role": "user", "content": raw_prompt(SOFTMAX)}]
    assert replayed(path, loop)[1] == "\nTurn two.\n</think>\n\nv2\n"


def test_plain_text_without_opening_tag(tmp_path: Path) -> None:
    text = tmp_path / "answer.txt"
    text.write_text("The template opened the reasoning.\n</think>\n\nanswer")
    [path] = import_traces([text], tmp_path / "out", problem="softmax", tokens_per_s=40.0)
    iteration = Trace.load(path).iterations[0]
    assert iteration.reasoning.text == "The template opened the reasoning.\n"
    assert iteration.final.text == "</think>\n\nanswer" and iteration.messages is None


# -- chunk logs ------------------------------------------------------------------------------------


REASONING_DELTAS = [" Let", " me", " think", " about", " the", " row", " length", ".", "\nIt", " is", " long", "."]
CONTENT_DELTAS = ["Here", " is", " the", " kernel", "."]


def _chunk(text: str, key: str, **extra: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-s1", "object": "chat.completion.chunk", "model": "qwq-32b",
            "choices": [{"index": 0, "delta": {key: text}, "finish_reason": None}], **extra}


def test_chunk_log_keeps_recorded_arrival_times(tmp_path: Path, loop: Any) -> None:
    lines: list[dict[str, Any]] = [{"t": 0.0, "problem": "softmax",
                                    "request": {"messages": [{"role": "user", "content": "Make softmax fast."}]}}]
    t, expected_reasoning = 0.8, []
    for text in REASONING_DELTAS:
        lines.append({"t": t, **_chunk(text, "reasoning_content")})
        expected_reasoning.append((round(t, 6), text))
        t += 0.031
    content_times = []
    for text in CONTENT_DELTAS:
        lines.append({"t": t, "chunk": _chunk(text, "content")})   # the wrapped shape
        content_times.append(round(t, 6))
        t += 0.02
    lines.append({"t": t, "id": "chatcmpl-s1", "choices": [], "usage": {"completion_tokens": 20}})
    [path] = import_traces([write_jsonl(tmp_path / "stream.jsonl", lines)], tmp_path / "out")
    trace = Trace.load(path)
    assert trace.metadata.timing == "recorded" and trace.metadata.token_rate is None
    iteration = trace.iterations[0]
    # Each chunk is at the arrival time of the delta that completed it; tokens that arrived
    # together are one chunk, as streamed.
    char_times = [t for t, text in expected_reasoning for _ in text]
    offset = 0
    for chunk in iteration.reasoning.chunks:
        offset += len(chunk.text)
        assert round(chunk.t, 6) == char_times[offset - 1]
    assert len({c.t for c in iteration.reasoning.chunks}) == len(iteration.reasoning.chunks) >= 10
    assert iteration.reasoning.chunks[0].t == pytest.approx(0.8)
    assert iteration.reasoning.text == "".join(REASONING_DELTAS)
    assert iteration.final.text == "</think>\n\n" + "".join(CONTENT_DELTAS)
    assert iteration.final.chunks[0].t == pytest.approx(content_times[0])
    assert iteration.final.chunks[-1].t == pytest.approx(content_times[-1])
    assert replayed(path, loop) == ["".join(REASONING_DELTAS) + "</think>\n\n" + "".join(CONTENT_DELTAS)]


def test_chunk_log_absolute_times_sse_lines_and_inline_think_tags(tmp_path: Path) -> None:
    # Raw SSE with epoch times, no request line (the first token lands ttft_s after the request),
    # and no reasoning parser: the think tags stream inside `content`.
    texts = ["<think>", "\nPlan", ": fuse", ".\n", "</think>", "\n\nDone", "."]
    base = 1767225600.0
    body = "".join(f"data: {json.dumps({'ts': base + 0.1 * i, **_chunk(text, 'content')})}\n\n"
                   for i, text in enumerate(texts)) + "data: [DONE]\n\n"
    source = tmp_path / "stream.sse"
    source.write_text(body)
    [path] = import_traces([source], tmp_path / "out", problem="softmax", ttft_s=0.3)
    iteration = Trace.load(path).iterations[0]
    assert iteration.reasoning.text == "\nPlan: fuse.\n" and iteration.final.text == "</think>\n\nDone."
    assert iteration.reasoning.chunks[0].t == pytest.approx(0.3 + 0.1)
    assert iteration.final.chunks[0].t == pytest.approx(0.3 + 0.4)
    assert iteration.final.chunks[-1].t == pytest.approx(0.3 + 0.6)


def test_chunk_log_iso_times_and_varying_created(tmp_path: Path) -> None:
    iso = [{"timestamp": f"2026-01-01T00:00:0{i}.500+00:00", **_chunk(text, key)}
           for i, (text, key) in enumerate([(" a", "reasoning_content"), (" b", "reasoning_content"), ("c", "content")])]
    created = [{**_chunk(text, key, id="other"), "created": 100 + i}
               for i, (text, key) in enumerate([(" x", "reasoning_content"), ("y", "content")])]
    paths = import_traces([write_jsonl(tmp_path / "s.jsonl", [{"messages": [], "t": "2026-01-01T00:00:00+00:00"},
                                                              *iso, *created])],
                          tmp_path / "out", problem="softmax")
    # Two streams whose chats do not show one conversation: two traces of one problem.
    assert [p.name for p in paths] == ["softmax.0.trace.json", "softmax.1.trace.json"]
    [first], [second] = (Trace.load(p).iterations for p in paths)
    assert [c.t for c in first.reasoning.chunks] == pytest.approx([0.5, 1.5])
    assert first.final.chunks[0].t == pytest.approx(2.5)
    # A new chunk id starts a new stream; `created` varies there, so it is the arrival time.
    assert second.reasoning.text == " x" and second.final.chunks[0].t - second.reasoning.chunks[0].t == pytest.approx(1.0)


def test_chunk_log_without_times_uses_the_stated_rate(tmp_path: Path) -> None:
    lines = [_chunk(text, "reasoning_content") for text in REASONING_DELTAS] + [_chunk("ok", "content")]
    source = write_jsonl(tmp_path / "stream.jsonl", lines)
    with pytest.raises(TraceImportError, match=r"stream\.jsonl, line 1, field t: .*--tokens-per-s"):
        import_traces([source], tmp_path / "out", problem="softmax")
    [path] = import_traces([source], tmp_path / "out", problem="softmax", tokens_per_s=25.0, ttft_s=0.0)
    trace = Trace.load(path)
    assert trace.metadata.timing == "rate" and trace.metadata.token_rate == 25.0
    assert trace.iterations[0].reasoning.chunks[1].t == pytest.approx(1 / 25.0)


# -- many problems, many turns ---------------------------------------------------------------------


def test_one_file_many_problems_and_turns_in_explicit_order(tmp_path: Path) -> None:
    records = []
    for problem, turn in [("softmax", 2), ("layernorm", 1), ("softmax", 0), ("layernorm", 0), ("softmax", 1)]:
        records.append({"problem_name": problem, "turn": turn,
                        "messages": [{"role": "user", "content": f"{problem} please"}],
                        "response": completion(f"{problem} turn {turn} reasoning.", f"{problem} v{turn}")})
    paths = import_traces([write_jsonl(tmp_path / "many.jsonl", records)], tmp_path / "out", tokens_per_s=40.0)
    assert sorted(p.name for p in paths) == ["layernorm.trace.json", "softmax.trace.json"]
    by_problem = {Trace.load(p).metadata.problem: Trace.load(p) for p in paths}
    assert [it.reasoning.text for it in by_problem["softmax"].iterations] == [
        f"softmax turn {n} reasoning." for n in range(3)]
    assert [it.final.text for it in by_problem["layernorm"].iterations] == [
        f"</think>\n\nlayernorm v{n}" for n in range(2)]


def test_samples_of_a_problem_across_files_are_numbered_in_file_order(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", [{"problem": "softmax", "response": completion("A.", "a")}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"problem": "softmax", "response": completion("B.", "b")}])
    paths = import_traces([b, a], tmp_path / "out", tokens_per_s=40.0)
    assert [p.name for p in paths] == ["softmax.0.trace.json", "softmax.1.trace.json"]
    traces = [Trace.load(p) for p in paths]
    assert [[it.reasoning.text for it in t.iterations] for t in traces] == [["B."], ["A."]]
    assert [t.metadata.imported_from for t in traces] == [[str(b)], [str(a)]]
    assert all(t.metadata.problem == "softmax" for t in traces)


# -- problems --------------------------------------------------------------------------------------


def test_bundled_problem_recovered_from_raw_kernelbench_prompt(tmp_path: Path) -> None:
    record = {"messages": [{"role": "user", "content": raw_prompt(SOFTMAX)}], "response": completion("R.", "A")}
    [path] = import_traces([write_jsonl(tmp_path / "r.jsonl", [record])], tmp_path / "out", tokens_per_s=40.0)
    assert Trace.load(path).metadata.problem == "softmax"


@pytest.mark.parametrize("shape", ["fenced", "raw"])
def test_unmatched_embedded_problem_is_written_beside_the_trace(tmp_path: Path, shape: str) -> None:
    prompt = fenced_prompt(UNKNOWN) if shape == "fenced" else raw_prompt(UNKNOWN)
    record = {"messages": [{"role": "user", "content": prompt}], "response": completion("R.", "A")}
    [path] = import_traces([write_jsonl(tmp_path / "r.jsonl", [record])], tmp_path / "out", tokens_per_s=40.0)
    name = Trace.load(path).metadata.problem
    assert name.startswith("imported_") and path.name == f"{name}.trace.json"
    program = tmp_path / "out" / f"{name}.py"
    assert program.read_text() == UNKNOWN
    # The name comes from a stable hash: the same source, however indented, names the same problem.
    again = {"messages": [{"role": "user", "content": fenced_prompt(UNKNOWN.replace("\n\n\n", "\n\n"))}],
             "response": completion("R2.", "A2")}
    [path2] = import_traces([write_jsonl(tmp_path / "r2.jsonl", [again])], tmp_path / "out2", tokens_per_s=40.0)
    assert Trace.load(path2).metadata.problem == name


def test_problems_dir_match_is_copied_beside_the_trace(tmp_path: Path) -> None:
    problems = tmp_path / "problems"
    problems.mkdir()
    (problems / "triple.py").write_text(UNKNOWN)
    record = {"messages": [{"role": "user", "content": fenced_prompt(UNKNOWN)}], "response": completion("R.", "A")}
    [path] = import_traces([write_jsonl(tmp_path / "r.jsonl", [record])], tmp_path / "out", tokens_per_s=40.0,
                           problems_dirs=[problems])
    assert Trace.load(path).metadata.problem == "triple"
    assert (tmp_path / "out" / "triple.py").read_text() == UNKNOWN


def test_embedded_sources_skip_modelnew_blocks() -> None:
    text = fenced_prompt(SOFTMAX) + "\nBest so far:\n```python\nclass ModelNew(nn.Module):\n    pass\n```\n"
    [source] = embedded_sources(text)
    assert "class Model(nn.Module)" in source and "ModelNew" not in source


# -- tokenizer -------------------------------------------------------------------------------------


def test_huggingface_tokenizer(tmp_path: Path, tiny_model_path: str, tiny_tokenizer: Any, loop: Any) -> None:
    reasoning = "Thinking about ünïcode ✓ kernels and block sizes."
    record = {"problem": "softmax", "response": completion(reasoning, "done ✓")}
    [path] = import_traces([write_jsonl(tmp_path / "r.jsonl", [record])], tmp_path / "out", tokens_per_s=40.0,
                           tokenizer=tiny_model_path)
    trace = Trace.load(path)
    assert trace.vocab is None
    assert trace.metadata.tokenizer == {"kind": "huggingface", "name_or_path": tiny_model_path}
    iteration = trace.iterations[0]
    assert iteration.reasoning.text == reasoning
    assert iteration.reasoning.token_ids == tiny_tokenizer.encode(reasoning, add_special_tokens=False)
    assert iteration.final.text == "</think>\n\ndone ✓"
    assert replayed(path, loop) == [reasoning + "</think>\n\ndone ✓"]


# -- bad input -------------------------------------------------------------------------------------


def _good(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "good.jsonl", [{"problem": "softmax", "response": completion("R.", "A")}])


BAD_INPUTS: list[tuple[str, str, str, list[str]]] = [
    # (name, file name, content, fragments the message must hold)
    ("truncated json", "t.jsonl",
     json.dumps({"problem": "softmax", "response": completion("R.", "A")}) + "\n"
     + '{"problem": "softmax", "response": {"choices": [{"message": {"reasoning_con\n',
     ["t.jsonl, line 2", "not valid JSON"]),
    ("truncated json document", "t.json", '[\n  {"problem": "softmax",\n   "response": {"choices": [',
     ["t.json, line 2", "not valid JSON"]),
    ("no reasoning", "n.jsonl",
     json.dumps({"problem": "softmax", "response": completion("R.", "A")}) + "\n"
     + json.dumps({"problem": "softmax", "response": completion(None, "just an answer")}) + "\n",
     ["n.jsonl, line 2", "field response.choices[0].message.reasoning_content", "no reasoning"]),
    ("unknown problem without source", "u.jsonl",
     json.dumps({"messages": [{"role": "user", "content": "Make it fast."}], "response": completion("R.", "A")}) + "\n",
     ["u.jsonl, line 1", "field messages", "unknown problem"]),
    ("unknown named problem without source", "u.jsonl",
     json.dumps({"metadata": {"problem": "nope"}, "response": completion("R.", "A")}) + "\n",
     ["u.jsonl, line 1", "field metadata.problem", "unknown problem 'nope'"]),
    ("decreasing timestamps", "d.jsonl",
     "".join(json.dumps({"t": t, "problem": "softmax", **_chunk(" w", "reasoning_content")}) + "\n"
             for t in (0.5, 0.6, 0.55, 0.7)),
     ["d.jsonl, line 3", "field t", "before the previous"]),
    ("plain text without closing tag", "p.txt", "<think>\nthinking forever\n",
     ["p.txt, line 1", "field text", "no reasoning"]),
    ("think-end inside the reasoning", "e.jsonl",
     json.dumps({"problem": "softmax", "response": completion("a </think> b", "A")}) + "\n",
     ["e.jsonl, line 1", "field response.choices[0].message.reasoning_content", "think-end tag"]),
    ("request with no response", "q.jsonl",
     json.dumps({"problem": "softmax", "messages": [{"role": "user", "content": "hi"}]}) + "\n",
     ["q.jsonl, line 1", "field messages", "no response"]),
    ("not a record", "x.jsonl", json.dumps({"hello": "world"}) + "\n", ["x.jsonl, line 1", "field choices"]),
    ("bad message role", "m.jsonl",
     json.dumps({"problem": "softmax", "messages": [{"content": "hi"}], "response": completion("R.", "A")}) + "\n",
     ["m.jsonl, line 1", "field messages[0].role"]),
]


@pytest.mark.parametrize("name,file_name,content,fragments", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_names_file_line_field_and_leaves_nothing(tmp_path: Path, capsys: Any, name: str,
                                                            file_name: str, content: str,
                                                            fragments: list[str]) -> None:
    bad = tmp_path / file_name
    bad.write_text(content)
    out = tmp_path / "out"
    # A good file first: what it would have produced must not be left behind either.
    with pytest.raises(TraceImportError) as info:
        import_traces([_good(tmp_path), bad], out, tokens_per_s=40.0)
    message = str(info.value)
    assert isinstance(info.value, UsageError) and "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    assert not out.exists()
    # The CLI: exit code 2, one line on stderr, and an existing --out left as it was.
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code = cli_main(["trace", "import", str(_good(tmp_path)), str(bad), "--out", str(out), "--tokens-per-s", "40"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("specgen trace: error: ") and fragments[0] in err
    assert files_under(out) == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"


def test_missing_input_file_and_bad_options(tmp_path: Path) -> None:
    with pytest.raises(TraceImportError, match="does not exist"):
        import_traces([tmp_path / "missing.jsonl"], tmp_path / "out", tokens_per_s=40.0)
    with pytest.raises(TraceImportError, match="tokens-per-s"):
        import_traces([_good(tmp_path)], tmp_path / "out", tokens_per_s=0.0)
    plain = tmp_path / "p.txt"
    plain.write_text("<think>r</think>a")
    with pytest.raises(TraceImportError, match=r"p\.txt, line 1, field problem \(--problem\): unknown problem"):
        import_traces([plain], tmp_path / "out", tokens_per_s=40.0, problem="other")
    with pytest.raises(TraceImportError, match=r"p\.txt, line 1, field messages: unknown problem.*--prompt"):
        import_traces([plain], tmp_path / "out", tokens_per_s=40.0)
    assert not (tmp_path / "out").exists()


def test_existing_trace_needs_force_and_a_failed_move_is_undone(tmp_path: Path, monkeypatch: Any) -> None:
    out = tmp_path / "out"
    [path] = import_traces([_good(tmp_path)], out, tokens_per_s=40.0)
    before = path.read_text()
    other = write_jsonl(tmp_path / "other.jsonl", [{"problem": "softmax", "response": completion("Other.", "B")}])
    with pytest.raises(TraceImportError, match="softmax.trace.json exists .--force replaces it."):
        import_traces([other], out, tokens_per_s=40.0)
    assert path.read_text() == before
    # A failure while moving files into place restores what was there and removes what was new.
    two = write_jsonl(tmp_path / "two.jsonl", [{"problem": "softmax", "response": completion("S.", "s")},
                                               {"problem": "layernorm", "response": completion("L.", "l")}])
    real_replace = os.replace
    calls = {"n": 0}

    def failing_replace(src: Any, dst: Any) -> None:
        calls["n"] += 1
        if Path(dst).name == "layernorm.trace.json":
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(TraceImportError, match="cannot write"):
        import_traces([two], out, tokens_per_s=40.0, force=True)
    monkeypatch.setattr(os, "replace", real_replace)
    assert files_under(out) == ["softmax.trace.json"] and path.read_text() == before
    import_traces([other], out, tokens_per_s=40.0, force=True)
    assert Trace.load(path).iterations[0].reasoning.text == "Other."


def test_cli_imports_and_reports(tmp_path: Path, capsys: Any) -> None:
    code = cli_main(["trace", "import", str(_good(tmp_path)), "--out", str(tmp_path / "out"),
                     "--tokens-per-s", "40", "--model", "my-model"])
    assert code == 0
    assert "softmax.trace.json (problem softmax, 1 turn(s), timing rate)" in capsys.readouterr().out
    assert Trace.load(tmp_path / "out" / "softmax.trace.json").metadata.model == "my-model"


def test_import_metadata_fields_are_optional_and_checked(tmp_path: Path) -> None:
    [path] = import_traces([_good(tmp_path)], tmp_path / "out", tokens_per_s=40.0)
    data = json.loads(path.read_text())
    assert data["metadata"]["timing"] == "rate" and data["metadata"]["imported_from"] == [str(tmp_path / "good.jsonl")]
    data["metadata"]["timing"] = "guessed"
    bad = tmp_path / "bad.trace.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(TraceFormatError, match="field metadata.timing"):
        Trace.load(bad)
    # Traces without the fields (hand-written, recorded) load as before and are written without them.
    del data["metadata"]["timing"], data["metadata"]["imported_from"]
    bad.write_text(json.dumps(data))
    trace = Trace.load(bad)
    assert trace.metadata.timing == "" and "timing" not in trace.to_json()["metadata"]


# -- the data as it is: byte-order marks, line ends, sizes -----------------------------------------


def _record(reasoning: str = REASONING, answer: str = ANSWER, **extra: Any) -> dict[str, Any]:
    return {"problem": "softmax", "messages": [{"role": "user", "content": "Make softmax fast."}],
            "response": completion(reasoning, answer), **extra}


@pytest.mark.parametrize("bom", [False, True], ids=["no-bom", "bom"])
@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_json_lines_and_arrays_with_a_byte_order_mark_or_crlf(tmp_path: Path, bom: bool, newline: str) -> None:
    records = [_record("First.", "a"), _record("Second.", "b", turn=1)]
    records[0]["turn"] = 0
    head = b"\xef\xbb\xbf" if bom else b""
    lines = tmp_path / "r.jsonl"
    lines.write_bytes(head + "".join(json.dumps(r) + newline for r in records).encode())
    array = tmp_path / "r.json"
    array.write_bytes(head + json.dumps(records, indent=2).replace("\n", newline).encode())
    for source in (lines, array):
        [path] = import_traces([source], tmp_path / source.suffix[1:], tokens_per_s=40.0)
        trace = Trace.load(path)
        assert [it.reasoning.text for it in trace.iterations] == ["First.", "Second."]
        assert [it.final.text for it in trace.iterations] == ["</think>\n\na", "</think>\n\nb"]


def test_plain_text_and_prompt_with_a_byte_order_mark_and_crlf(tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.md"
    prompt.write_bytes(b"\xef\xbb\xbf" + raw_prompt(SOFTMAX).replace("\n", "\r\n").encode())
    text = tmp_path / "answer.txt"
    text.write_bytes(b"\xef\xbb\xbf" + ("<think>\n" + REASONING + "</think>\n\n" + ANSWER).replace("\n", "\r\n").encode())
    [path] = import_traces([text], tmp_path / "out", prompt=prompt, tokens_per_s=40.0)
    iteration = Trace.load(path).iterations[0]
    assert iteration.reasoning.text == "\n" + REASONING and iteration.final.text == "</think>\n\n" + ANSWER
    assert iteration.messages == [{"role": "user", "content": raw_prompt(SOFTMAX)}]
    assert Trace.load(path).metadata.problem == "softmax"


def test_sse_with_crlf_and_a_lone_cr_kept_as_text(tmp_path: Path) -> None:
    body = "".join(f"data: {json.dumps({'t': 0.1 * (i + 1), **_chunk(text, key)})}\r\n\r\n"
                   for i, (text, key) in enumerate([("a\rb", "reasoning_content"), ("c", "content")]))
    source = tmp_path / "s.sse"
    source.write_bytes(b"\xef\xbb\xbf" + (body + "data: [DONE]\r\n").encode())
    [path] = import_traces([source], tmp_path / "out", problem="softmax")
    iteration = Trace.load(path).iterations[0]
    assert iteration.reasoning.text == "a\rb" and iteration.final.text == "</think>\n\nc"


def test_a_record_over_the_size_limit_fails_fast_without_reading_it_all(tmp_path: Path, capsys: Any) -> None:
    import time
    import tracemalloc

    big = tmp_path / "big.jsonl"
    with big.open("w") as handle:
        handle.write(json.dumps(_record("Small.", "a")) + "\n")
        handle.write(json.dumps(_record("Also small.", "b", padding="x" * 30_000_000)) + "\n")
    out = tmp_path / "out"
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(TraceImportError) as info:
            import_traces([big], out, tokens_per_s=40.0, max_record_mb=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 10
    assert peak < 12_000_000            # a few blocks of the 30 MB line, not all of it
    assert str(info.value) == (f"{big}, line 2: record 2 is larger than 2 MB, the limit per record "
                               "(--max-record-mb sets it)")
    assert not out.exists()
    # The default limit refuses it as well; the option lets it in.
    with pytest.raises(TraceImportError, match=r"line 2: record 2 is larger than 8 MB"):
        import_traces([big], out, tokens_per_s=40.0)
    code = cli_main(["trace", "import", str(big), "--out", str(out), "--tokens-per-s", "40", "--max-record-mb", "1"])
    assert code == 2 and "record 2 is larger than 1 MB" in capsys.readouterr().err
    assert cli_main(["trace", "import", str(big), "--out", str(out), "--tokens-per-s", "40",
                     "--max-record-mb", "40"]) == 0
    assert len(list(out.glob("*.trace.json"))) == 2


def test_size_limit_in_arrays_streams_and_plain_text(tmp_path: Path) -> None:
    array = tmp_path / "a.json"                 # one line, as json.dump writes it
    array.write_text(json.dumps([_record("One.", "a"), _record("Two.", "b"), _record("x" * 3000, "c")]))
    with pytest.raises(TraceImportError, match=r"a\.json, line 1: record 3 is larger than 0\.002 MB"):
        import_traces([array], tmp_path / "out", tokens_per_s=40.0, max_record_mb=0.002)
    stream = write_jsonl(tmp_path / "s.jsonl", [{"t": 0.0, "problem": "softmax", "messages": []}]
                         + [{"t": 0.1 + i, **_chunk("y" * 100, "reasoning_content")} for i in range(30)])
    with pytest.raises(TraceImportError, match=r"s\.jsonl, line 1: the stream that starts here holds more than "
                                               r"0\.002 MB of text"):
        import_traces([stream], tmp_path / "out", max_record_mb=0.002)
    plain = tmp_path / "p.txt"
    plain.write_text("<think>short</think>ok\n<think>" + "z" * 3000 + "</think>too long\n")
    with pytest.raises(TraceImportError, match=r"p\.txt, line 2, field text: turn 2 is larger than 0\.002 MB"):
        import_traces([plain], tmp_path / "out", tokens_per_s=40.0, problem="softmax", max_record_mb=0.002)
    with pytest.raises(TraceImportError, match="max-record-mb must be > 0"):
        import_traces([plain], tmp_path / "out", tokens_per_s=40.0, problem="softmax", max_record_mb=0)


def test_records_across_read_blocks(tmp_path: Path, monkeypatch: Any) -> None:
    from specgen.traces.importing import text as importing_text

    # Tiny blocks: every record, string, escape and line end is cut somewhere.
    monkeypatch.setattr(importing_text, "_BLOCK_BYTES", 7)
    records = [_record("Ré\\sön \"quoted\"\n" * 3, "a ✓", turn=0), _record("Next.", "b", turn=1)]
    lines = tmp_path / "r.jsonl"
    lines.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r, indent=1) + "\r\n" for r in records).encode())
    [path] = import_traces([lines], tmp_path / "out", tokens_per_s=40.0)
    assert [it.reasoning.text for it in Trace.load(path).iterations] == [records[0]["response"]["choices"][0][
        "message"]["reasoning_content"], "Next."]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_record("R.", "a")) + "\n" + '{"problem": "softmax", "x": [1, 2,, 3]}\n'
                   + json.dumps(_record("S.", "b")) + "\n")
    with pytest.raises(TraceImportError, match=r"bad\.jsonl, line 2: not valid JSON .*Expecting value at column 35"):
        import_traces([bad], tmp_path / "out2", tokens_per_s=40.0)


# -- duplicates ------------------------------------------------------------------------------------


def test_identical_records_are_imported_once_and_repeated_ids_reported(tmp_path: Path, capsys: Any) -> None:
    one, two = _record("First sample.", "a"), _record("Second sample.", "b")
    three = _record("Third sample.", "c")
    three["response"]["id"] = one["response"]["id"]             # the same id, other content
    source = write_jsonl(tmp_path / "r.jsonl", [one, two, one, three, two])
    again = write_jsonl(tmp_path / "again.jsonl", [one])
    messages: list[str] = []
    paths = import_traces([source, again], tmp_path / "out", tokens_per_s=40.0, on_warning=messages.append)
    assert [[it.reasoning.text for it in Trace.load(p).iterations] for p in paths] == [
        ["First sample."], ["Second sample."], ["Third sample."]]
    assert messages == [
        f"3 duplicate record(s) skipped: the same problem, chat, reasoning and answer as an earlier record "
        f"(first: {source}, line 3, the same as {source}, line 1)",
        f"1 record(s) repeat the id of an earlier record with other content, imported as records of their own "
        f"(first: id {one['response']['id']!r} at {source}, line 4, also at {source}, line 1)"]
    # Through the API without a callback: Python warnings. Through the CLI: in the summary.
    with pytest.warns(TraceImportWarning) as caught:
        import_traces([source, again], tmp_path / "out2", tokens_per_s=40.0)
    assert [str(w.message) for w in caught] == messages
    assert cli_main(["trace", "import", str(source), str(again), "--out", str(tmp_path / "out3"),
                     "--tokens-per-s", "40"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5 and lines[3].startswith("warning: 3 duplicate record(s) skipped")
    assert lines[4].startswith("warning: 1 record(s) repeat the id")


# -- samples and conversations ---------------------------------------------------------------------


def test_independent_samples_are_single_turn_traces_with_stable_names(tmp_path: Path, loop: Any) -> None:
    # Three samples of one problem, the same prompt, and one sample of another: nothing says
    # conversation, so each is a trace of its own.
    records = [{"messages": [{"role": "user", "content": fenced_prompt(SOFTMAX)}],
                "response": completion(f"Sample {n}.", f"answer {n}")} for n in range(3)]
    records.insert(1, {"problem": "layernorm", "response": completion("Other.", "x")})
    source = write_jsonl(tmp_path / "samples.jsonl", records)
    imported: list[Any] = []
    for out in ("out", "again"):
        from specgen.traces.importing import import_traces_detailed

        imported.append(import_traces_detailed([source], tmp_path / out, tokens_per_s=40.0))
    first = imported[0]
    assert [(i.path.name, i.problem, i.sample, i.turns) for i in first] == [
        ("softmax.0.trace.json", "softmax", "0", 1), ("softmax.1.trace.json", "softmax", "1", 1),
        ("softmax.2.trace.json", "softmax", "2", 1), ("layernorm.trace.json", "layernorm", None, 1)]
    assert [i.path.name for i in imported[1]] == [i.path.name for i in first]     # stable
    assert [Trace.load(i.path).iterations[0].reasoning.text for i in first[:3]] == [f"Sample {n}." for n in range(3)]
    assert "sample 1 of 3" in Trace.load(first[1].path).metadata.notes
    # A bench takes each as an entry of its own, with one iteration, all posing softmax.
    from specgen.optimize.bench_problems import problems_from_traces

    problems = problems_from_traces([i.path for i in first])
    assert [(p.name, p.problem, len(p.trace.iterations)) for p in problems] == [
        (f"softmax#{n}", "softmax", 1) for n in range(3)] + [("layernorm", "layernorm", 1)]


def test_a_conversation_across_records_is_one_trace(tmp_path: Path) -> None:
    # Each request carries the chat so far: the previous answer, then the feedback.
    prompt = {"role": "user", "content": fenced_prompt(SOFTMAX)}
    first = {"messages": [prompt], "response": completion("Turn one.", "<code v1>")}
    second = {"messages": [prompt, {"role": "assistant", "content": "<code v1>"},
                           {"role": "user", "content": "Correct, 1.1x. Faster."}],
              "response": completion("Turn two.", "<code v2>")}
    third = {"messages": [*second["messages"],
                          {"role": "assistant", "content": "<think>sent back</think>\n<code v2>"},
                          {"role": "user", "content": "Wrong output."}],
             "response": completion("Turn three.", "<code v3>")}
    alone = {"messages": [prompt], "response": completion("Another sample.", "<code w1>")}
    source = write_jsonl(tmp_path / "chat.jsonl", [first, alone, second, third])
    paths = import_traces([source], tmp_path / "out", tokens_per_s=40.0)
    assert [p.name for p in paths] == ["softmax.0.trace.json", "softmax.1.trace.json"]
    conversation, sample = (Trace.load(p) for p in paths)
    assert [it.reasoning.text for it in conversation.iterations] == ["Turn one.", "Turn two.", "Turn three."]
    assert conversation.iterations[1].messages == second["messages"]
    assert [it.reasoning.text for it in sample.iterations] == ["Another sample."]


def test_a_loop_that_quotes_the_best_kernel_in_a_fresh_prompt_is_one_conversation(tmp_path: Path) -> None:
    from specgen.optimize.prompts import chat

    kernel = ("import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
              "        return torch.softmax(x, dim=-1)\n")

    class Best:
        speedup = 1.25
        source = kernel

    first = {"messages": chat(SOFTMAX, [], None), "response": completion("Turn one.", f"```python\n{kernel}```\n")}
    second = {"messages": chat(SOFTMAX, [], Best()), "response": completion("Turn two.", "```python\nv2\n```")}
    sample = {"messages": chat(SOFTMAX, [], None), "response": completion("A sample.", f"```python\n{kernel}```")}
    [one, two] = import_traces([write_jsonl(tmp_path / "loop.jsonl", [first, sample, second])], tmp_path / "out",
                               tokens_per_s=40.0)
    assert [it.reasoning.text for it in Trace.load(one).iterations] == ["Turn one."]
    # The second turn's prompt quotes the kernel both earlier samples answered; the latest of them wins.
    assert [it.reasoning.text for it in Trace.load(two).iterations] == ["A sample.", "Turn two."]


def test_sample_fields_and_repeated_turn_numbers(tmp_path: Path) -> None:
    records = [{"problem": "softmax", "sample_id": sample, "turn": turn,
                "messages": [{"role": "user", "content": f"sample {sample} turn {turn}"}],
                "response": completion(f"S{sample} T{turn}.", "a")}
               for turn in (1, 0) for sample in (7, 3)]
    paths = import_traces([write_jsonl(tmp_path / "s.jsonl", records)], tmp_path / "out", tokens_per_s=40.0)
    assert [p.name for p in paths] == ["softmax.7.trace.json", "softmax.3.trace.json"]
    assert [[it.reasoning.text for it in Trace.load(p).iterations] for p in paths] == [
        ["S7 T0.", "S7 T1."], ["S3 T0.", "S3 T1."]]
    # The same numbers without a sample field: the chats must show which conversation goes on.
    for record in records:
        del record["sample_id"]
    with pytest.raises(TraceImportError, match=r"line 1, field turn: problem 'softmax' has several records "
                                               r"numbered 1.*sample field"):
        import_traces([write_jsonl(tmp_path / "n.jsonl", records)], tmp_path / "out2", tokens_per_s=40.0)
    # Only turn 0 several times: independent samples.
    only_first = write_jsonl(tmp_path / "z.jsonl", [r for r in records if r["turn"] == 0])
    assert len(import_traces([only_first], tmp_path / "out3", tokens_per_s=40.0)) == 2
    mixed = write_jsonl(tmp_path / "m.jsonl", [{**records[0], "sample": 1}, records[1]])
    with pytest.raises(TraceImportError, match=r"m\.jsonl, line 2, field sample: .*a sample field"):
        import_traces([mixed], tmp_path / "out4", tokens_per_s=40.0)


# -- signals ---------------------------------------------------------------------------------------


_PAUSING_IMPORT = """
import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)   # as in a terminal, whatever started the tests
from specgen.cli import main
from specgen.traces.format import Trace
saved = Path(sys.argv[1])
real_save = Trace.save
def save(self, path):
    real_save(self, path)
    saved.write_text(str(path))
    time.sleep(120)                                         # a slow disk: the signal comes meanwhile
Trace.save = save
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_signal_during_the_import_leaves_nothing_behind(tmp_path: Path, signum: str) -> None:
    import signal
    import subprocess
    import sys
    import time

    source = write_jsonl(tmp_path / "r.jsonl", [_record(f"Sample {n}. " * 200, "a") for n in range(20)])
    saved = tmp_path / "saved"
    for existing in (False, True):
        out = tmp_path / f"out-{existing}"
        if existing:
            out.mkdir()
            (out / "keep.txt").write_text("mine")
        saved.unlink(missing_ok=True)
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        process = subprocess.Popen([sys.executable, "-c", _PAUSING_IMPORT, str(saved), "trace", "import",
                                    str(source), "--out", str(out), "--tokens-per-s", "40"],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not saved.exists():
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert any(p.name.startswith(".trace-import-") for p in out.iterdir())    # staging, mid-import
            process.send_signal(getattr(signal, signum))
            _, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == {"SIGTERM": 143, "SIGINT": 130}[signum], err
        assert files_under(out) == (["keep.txt"] if existing else [])
        if signum == "SIGTERM":
            assert err == "specgen trace: interrupted by SIGTERM: nothing was imported\n"


def test_sigterm_raises_in_process_and_a_second_signal_waits_for_the_undo(tmp_path: Path, monkeypatch: Any) -> None:
    import shutil
    import signal

    from specgen.traces import format as trace_module
    from specgen.traces.importing import ImportInterrupted

    calls: list[str] = []
    before = signal.getsignal(signal.SIGTERM)

    def mine(*args: Any) -> None:
        calls.append("caller's handler")

    previous = signal.signal(signal.SIGTERM, mine)
    real_save, real_rmtree = trace_module.Trace.save, shutil.rmtree

    def save(self: Any, path: Any) -> Any:
        real_save(self, path)
        os.kill(os.getpid(), signal.SIGTERM)

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGTERM)      # arrives during the undo: must not cut it short
        real_rmtree(path, *args, **kwargs)

    try:
        monkeypatch.setattr(trace_module.Trace, "save", save)
        monkeypatch.setattr(shutil, "rmtree", rmtree)
        out = tmp_path / "out"
        with pytest.raises(ImportInterrupted) as info:
            import_traces([_good(tmp_path)], out / "deeper", tokens_per_s=40.0)
        assert info.value.signum == signal.SIGTERM and info.value.__context__ is not None
        assert not out.exists() and calls == []
        assert signal.getsignal(signal.SIGTERM) is mine        # restored after the import
        monkeypatch.setattr(trace_module.Trace, "save", real_save)
        monkeypatch.setattr(shutil, "rmtree", real_rmtree)
        # A signal once the files are in place (the staging folder is being removed) is the
        # caller's, delivered when the import returns.
        def late_rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            real_rmtree(path, *args, **kwargs)

        monkeypatch.setattr(shutil, "rmtree", late_rmtree)
        [path] = import_traces([_good(tmp_path)], out, tokens_per_s=40.0)
        monkeypatch.setattr(shutil, "rmtree", real_rmtree)
        assert path.exists() and files_under(out) == ["softmax.trace.json"] and calls == ["caller's handler"]
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert signal.getsignal(signal.SIGTERM) is before


# -- each record's id, and a readable name ----------------------------------------------------------


def _unknown(scale: str) -> str:
    """Another unknown problem: UNKNOWN scaling by `scale` instead of three."""
    return UNKNOWN.replace("x * 3.0", f"x * {scale}").replace("by three", f"by {scale}")


def test_each_iteration_keeps_its_record_and_the_cli_names_them(tmp_path: Path, capsys: Any) -> None:
    records = [_record("First.", "a", turn=0, custom_id="req-7"), _record("Second.", "b", turn=1)]
    source = write_jsonl(tmp_path / "log.jsonl", records)
    second_id = records[1]["response"]["id"]           # no custom_id: the response's own id
    [path] = import_traces([source], tmp_path / "out", tokens_per_s=40.0)
    trace = Trace.load(path)
    assert [(it.record.id, it.record.file, it.record.line) for it in trace.iterations] == [
        ("req-7", str(source), 1), (second_id, str(source), 2)]
    assert json.loads(path.read_text())["iterations"][0]["record"] == {
        "id": "req-7", "file": str(source), "line": 1}
    # A plain-text turn has no id: its file and line say where it came from.
    (tmp_path / "p.md").write_text("Make softmax fast.")
    text = tmp_path / "answer.txt"
    text.write_text("<think>Plain.</think>" + ANSWER)
    [plain] = import_traces([text], tmp_path / "plain", tokens_per_s=40.0, prompt=tmp_path / "p.md",
                            problem="softmax")
    record = Trace.load(plain).iterations[0].record
    assert (record.id, record.file, record.line) == (None, str(text), 1)
    assert "id" not in json.loads(plain.read_text())["iterations"][0]["record"]
    assert cli_main(["trace", "import", str(source), "--out", str(tmp_path / "cli"),
                     "--tokens-per-s", "40"]) == 0
    assert f"; record(s) req-7, {second_id}" in capsys.readouterr().out


def test_an_unknown_problem_is_named_by_the_records_own_name(tmp_path: Path) -> None:
    def record(source: str, reasoning: str = "R.", **fields: Any) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": raw_prompt(source)}],
                "response": completion(reasoning, "A"), **fields}

    records = [record(UNKNOWN, name="level1/19_Triple.py"),
               record(_unknown("2.0"), metadata={"name": "19_Triple"}),    # from metadata, no level
               record(_unknown("4.0"), task_name="softmax"),              # a bundled problem's name
               record(_unknown("5.0"), problem_file="Quintuple.py"),
               record(_unknown("6.0"), name=7),                           # not a name: the hash
               record(UNKNOWN, "R6.", name="other_name")]                 # a program keeps its first name
    out = tmp_path / "out"
    paths = import_traces([write_jsonl(tmp_path / "r.jsonl", records)], out, tokens_per_s=40.0)
    names = [Trace.load(p).metadata.problem for p in paths]
    # The sixth record's program was named by the first: two samples of one problem.
    assert names[:2] == ["level1_19_Triple", "level1_19_Triple"]
    assert [p.name for p in paths[:2]] == ["level1_19_Triple.0.trace.json", "level1_19_Triple.1.trace.json"]
    assert names[2] == "19_Triple"
    assert names[3].startswith("softmax_") and len(names[3]) == len("softmax_") + 10
    assert names[4] == "Quintuple"
    assert names[5].startswith("imported_")
    assert (out / "level1_19_Triple.py").read_text() == UNKNOWN
    assert (out / f"{names[3]}.py").read_text() == _unknown("4.0")
    # A second program asking for a name the first one has gets the name with its own hash, the
    # same on every import of the same input.
    clash = [record(UNKNOWN, name="triple"), record(_unknown("2.0"), name="triple")]
    first = import_traces([write_jsonl(tmp_path / "c.jsonl", clash)], tmp_path / "c1", tokens_per_s=40.0)
    second = import_traces([write_jsonl(tmp_path / "c.jsonl", clash)], tmp_path / "c2", tokens_per_s=40.0)
    assert [p.name for p in first] == [p.name for p in second]
    clashed = [Trace.load(p).metadata.problem for p in first]
    assert clashed[0] == "triple" and clashed[1].startswith("triple_") and clashed[1] != "triple_"


def test_a_records_name_never_takes_a_name_another_record_gives_explicitly(tmp_path: Path) -> None:
    hinted = {"messages": [{"role": "user", "content": fenced_prompt(_unknown("2.0"))}],
              "response": completion("R1.", "A"), "name": "triple"}
    explicit = {"problem": "triple", "messages": [{"role": "user", "content": fenced_prompt(UNKNOWN)}],
                "response": completion("R2.", "A")}
    out = tmp_path / "out"
    paths = import_traces([write_jsonl(tmp_path / "r.jsonl", [hinted, explicit])], out, tokens_per_s=40.0)
    names = {Trace.load(p).iterations[0].reasoning.text: Trace.load(p).metadata.problem for p in paths}
    assert names["R2."] == "triple" and names["R1."].startswith("triple_")
    assert (out / "triple.py").read_text() == UNKNOWN
    assert (out / f"{names['R1.']}.py").read_text() == _unknown("2.0")
