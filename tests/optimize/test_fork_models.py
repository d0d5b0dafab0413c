"""Fork models, the ceiling of draft harvesting, and the synthetic trace generator."""
from __future__ import annotations

import asyncio
import statistics

import pytest

from specgen.bench.ceiling import ceiling
from specgen.traces.format import TraceBuilder
from specgen.traces.extraction import extract_candidate, kernel_bodies
from specgen.optimize.fork_models import DraftWriter, NamedWriter, fork_writer, latest_draft
from specgen.traces.synthetic import CandidateLibrary, generate_traces

KERNEL_A = ("import triton\nclass ModelNew:\n    pass\n@triton.jit\ndef alpha_kernel(x):\n"
            "    return x\n")
KERNEL_B = ("import triton\nclass ModelNew:\n    pass\n@triton.jit\ndef beta_kernel(x):\n"
            "    return x + 1\n")


def trace_with(reasoning: str, final: str):
    builder = TraceBuilder(token_rate=100.0, problem="softmax", hand_written=False)
    builder.add_iteration(reasoning, forks=[], final_text=f"```python\n{final}```\n")
    return builder.build()


def test_draft_uses_only_the_reasoning_before_the_fork() -> None:
    text = f"plan\n```python\n{KERNEL_A}```\nmore\n```python\n{KERNEL_B}```\n"
    cut = text.index("more")
    assert latest_draft(text[:cut]) == KERNEL_A
    assert latest_draft(text) == KERNEL_B
    assert latest_draft("```python\nclass ModelNew:\n") is None          # not closed
    trace = trace_with(text, KERNEL_B)
    written = asyncio.run(DraftWriter().write(trace.iterations[0], 0, text[:cut], ""))
    assert KERNEL_A in written and KERNEL_B not in written
    assert asyncio.run(DraftWriter().write(trace.iterations[0], 0, "no code yet", "")) == ""


UNFENCED = ("import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
            "        return x * 2\n")


def test_draft_reads_unfenced_programs_too() -> None:
    text = f"plan\n```python\n{KERNEL_A}```\nNow without a fence:\n\n{UNFENCED}\nWait, check it.\n"
    assert latest_draft(text) == UNFENCED
    assert latest_draft(text[:text.index("Now")]) == KERNEL_A
    # The fork closes the reasoning at its position: a program the text ends with is complete.
    assert latest_draft(text[:text.index("Wait")]) == UNFENCED
    # A class cut off before its forward returns is no draft; the fenced one before it is.
    assert latest_draft(text[:text.index("return x * 2")]) == KERNEL_A
    trace = trace_with(text, UNFENCED)
    written = asyncio.run(DraftWriter().write(trace.iterations[0], 0, text, ""))
    assert written == f"```python\n{UNFENCED}```\n"


def test_draft_forks_write_the_final_kernel_exactly_where_generated_traces_draft_it() -> None:
    # The generator drafts a turn's final kernel, fenced or not, only in correct turns, as the
    # last of its drafts; a draft fork at the reasoning's end writes it exactly then.
    problems = sorted({c.problem for c in CandidateLibrary.load().candidates})
    traces, plans = generate_traces(problems, 3, seed=11)
    unfenced = 0
    for trace, turns in zip(traces, plans):
        for iteration, plan in zip(trace.iterations, turns):
            final = extract_candidate(iteration.final.text, accept_unclosed=True)
            draft = latest_draft(iteration.reasoning.text)
            wrote_final = draft is not None and kernel_bodies(draft) == kernel_bodies(final)
            assert wrote_final == (plan.final_drafted_at is not None), plan
            assert plan.correct or not wrote_final
            unfenced += wrote_final and not plan.drafts[-1][2]
    assert unfenced > 0           # fenced blocks alone would miss these


def test_named_returns_the_answer_once_its_kernel_is_named() -> None:
    reasoning = "think " * 50 + "the beta_kernel idea " + "think " * 50
    trace = trace_with(reasoning, KERNEL_B)
    named = NamedWriter()
    before = reasoning.index("beta_kernel")
    assert asyncio.run(named.write(trace.iterations[0], 0, reasoning[:before], "")) == ""
    assert KERNEL_B in asyncio.run(named.write(trace.iterations[0], 0, reasoning[:before + 20], ""))
    with pytest.raises(ValueError, match="needs a live engine"):
        fork_writer("model")


def test_ceiling_stops_at_the_first_draft_of_the_final_kernel() -> None:
    reasoning = "a " * 300 + f"\n```python\n{KERNEL_A}```\n" + "b " * 300 + \
        f"\n```python\n{KERNEL_B}```\n" + "c " * 300
    trace = trace_with(reasoning, KERNEL_B)
    pooled, turns = ceiling([trace])
    assert turns[0].draft_position is not None and 0.5 < turns[0].draft_position < 0.9
    assert pooled == pytest.approx(turns[0].stop_tokens / turns[0].total_tokens)
    never = trace_with("a " * 300, KERNEL_B)
    assert ceiling([never])[0] == 1.0


def test_generator_is_seeded_and_follows_its_premises() -> None:
    problems = sorted({c.problem for c in CandidateLibrary.load().candidates})
    first, plans = generate_traces(problems, 5, seed=7)
    again, _ = generate_traces(problems, 5, seed=7)
    assert [t.to_json()["iterations"] for t in first] == [t.to_json()["iterations"] for t in again]
    assert all(not t.metadata.hand_written and "seed 7" in t.metadata.model for t in first)
    turns = [p for ps in plans for p in ps]
    tokens = [it.reasoning.num_tokens for t in first for it in t.iterations]
    assert 5_000 < statistics.median(tokens) < 14_000        # measured median 9.6k
    # No pre-written fork outputs: forks come from a fork model.
    assert all(not it.forks for t in first for it in t.iterations)
    drafted = [p for p in turns if p.final_drafted_at is not None]
    assert all(p.correct for p in drafted)
    assert all(0.5 <= p.final_drafted_at < 1.0 for p in drafted)


def test_a_new_fork_model_is_one_class_and_one_registration(tmp_path) -> None:
    """The worked example of docs/optimize.md: a toy fork model that writes the earliest complete
    draft, registered once, is offered by `specgen bench` and scripted by the virtual clock."""
    import json

    from specgen.cli import main
    from specgen.optimize import fork_models
    from specgen.traces.extraction import find_drafts
    from specgen.optimize.fork_models import ReplayWriter, register_fork_model

    class FirstDraftWriter(ReplayWriter):
        name = "first-draft"

        def program_at(self, reasoning_so_far, reasoning, final):
            drafts = find_drafts(reasoning_so_far, ended=True)
            return drafts[0].source.strip("\n") + "\n" if drafts else None

    register_fork_model("first-draft", lambda engine: FirstDraftWriter())
    try:
        assert "first-draft" in fork_models.replayable_fork_models()
        with pytest.raises(ValueError, match="already registered"):
            register_fork_model("first-draft", lambda engine: FirstDraftWriter())
        out = tmp_path / "bench"
        assert main(["bench", "--generate", "1", "--turns", "1", "--concurrency", "1", "--modes",
                     "specgen,sequential", "--problems", "softmax", "--seed", "3",
                     "--fork-model", "first-draft", "--out", str(out), "--quiet"]) == 0
        assert json.loads((out / "results.json").read_text())["fork_model"] == "first-draft"
    finally:
        fork_models.FORK_MODELS.pop("first-draft", None)


class _RecordingEngine:
    """What a live fork engine is asked: the chat it is given, and a fork that writes one line."""

    def __init__(self) -> None:
        self.chats: list[list[dict[str, str]]] = []

    def chat_prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        self.chats.append(messages)
        return [1]

    def encode(self, text: str) -> list[int]:
        return [2] * len(text)

    async def fork(self, request_id, prompt_ids, reasoning_ids, suffix_ids, params):
        class Delta:
            text = "written"
        yield Delta()


def test_a_live_fork_is_prompted_with_the_problem_where_the_trace_recorded_no_chat() -> None:
    problem_chat = [{"role": "user", "content": "optimize softmax"}]
    engine = _RecordingEngine()
    writer = fork_writer("model", engine, messages=problem_chat)
    generated = trace_with("thinking " * 20, KERNEL_A).iterations[0]          # no messages
    assert generated.messages in (None, [])
    assert asyncio.run(writer.write(generated, 5, "thinking", "now write")) == "written"
    builder = TraceBuilder(token_rate=100.0, problem="softmax", hand_written=False)
    own = [{"role": "user", "content": "the recorded prompt"}]
    builder.add_iteration("thinking " * 20, forks=[], final_text=KERNEL_A, messages=own)
    asyncio.run(writer.write(builder.build().iterations[0], 5, "thinking", "now write"))
    assert engine.chats == [problem_chat, own]
