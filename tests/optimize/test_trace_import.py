from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.engines.conftest import loop, tiny_model_path, tiny_tokenizer  # noqa: F401  (fixtures)
from specgen.cli import main as cli_main
from specgen.engines.base import GenerationParams
from specgen.engines.replay_engine import ReplayEngine
from specgen.engines.trace import Trace, TraceFormatError
from specgen.errors import UsageError
from specgen.optimize.bundled import bundled_problems
from specgen.optimize.trace_import import TraceImportError, embedded_sources, import_traces

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


def completion(reasoning: str | None, content: str, model: str = "qwq-32b", **extra: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1767225600, "model": model,
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
    [path] = import_traces([write_jsonl(tmp_path / "s.jsonl", [{"messages": [], "t": "2026-01-01T00:00:00+00:00"},
                                                               *iso, *created])],
                           tmp_path / "out", problem="softmax")
    first, second = Trace.load(path).iterations
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


def test_turns_of_a_problem_across_files_keep_file_order(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", [{"problem": "softmax", "response": completion("A.", "a")}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"problem": "softmax", "response": completion("B.", "b")}])
    [path] = import_traces([b, a], tmp_path / "out", tokens_per_s=40.0)
    trace = Trace.load(path)
    assert [it.reasoning.text for it in trace.iterations] == ["B.", "A."]
    assert trace.metadata.imported_from == [str(b), str(a)]


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
