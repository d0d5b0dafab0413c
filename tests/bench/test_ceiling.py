"""The ceiling of draft harvesting reads drafts the way the loop's inline-candidate trigger does."""
from __future__ import annotations

import random

import pytest

from specgen.bench.ceiling import ceiling, pooled, share_of_saving, turn_ceiling
from specgen.traces.format import Iteration, TraceBuilder
from specgen.traces.extraction import kernel_bodies
from specgen.traces.synthetic import LANGS, CandidateLibrary, generate_turn
from specgen.optimize.triggers import InlineCodeBlock, TriggerContext, TriggerPolicy
from tests.traces.test_extraction import AFTER, CUDA_PROGRAM, PROSE, TRITON_PROGRAM


def turn(reasoning: str, final: str) -> Iteration:
    builder = TraceBuilder(token_rate=100.0, problem="scale", hand_written=False)
    builder.add_iteration(reasoning, forks=[], final_text=f"Here it is:\n\n```python\n{final}```\n")
    return builder.build().iterations[0]


def harvested_at(iteration: Iteration, final: str, think_end: str = "</think>") -> int | None:
    """Tokens when the loop's inline trigger, fed the stream chunk by chunk, first hands over a
    program with the final answer's kernels (None: never): while the reasoning streams, or at the
    chunk delivering the think-end tag, where the loop reads the reasoning's end."""
    policy = TriggerPolicy([InlineCodeBlock()])
    text, tokens = "", 0
    for chunk in iteration.reasoning.chunks:
        start, previous = len(text), tokens
        text += chunk.text
        tokens += len(chunk.token_ids)
        decision = policy.decide(TriggerContext(iteration=0, reasoning_tokens=tokens, text=text,
                                                new_text_start=start, previous_tokens=previous))
        if decision and any(kernel_bodies(s) == kernel_bodies(final)
                            for s in decision.inline_candidates):
            return tokens
    answer = ""
    for chunk in iteration.final.chunks:
        answer += chunk.text
        tokens += len(chunk.token_ids)
        if think_end in answer:
            break
    if any(kernel_bodies(s) == kernel_bodies(final) for s in policy.finish(text)):
        return tokens
    return None


@pytest.mark.parametrize("fence", [True, False])
def test_ceiling_stops_where_the_loop_harvests_the_final_kernel(fence: bool) -> None:
    draft = f"```python\n{CUDA_PROGRAM}```\n" if fence else CUDA_PROGRAM
    reasoning = (PROSE * 20 + "\nA first try:\n\n" + TRITON_PROGRAM + AFTER + PROSE * 10
                 + "\nNow the CUDA version:\n\n" + draft + AFTER + PROSE * 10)
    iteration = turn(reasoning, CUDA_PROGRAM)
    result = turn_ceiling("scale", 0, iteration)
    assert result.draft_position is not None and 0.4 < result.draft_position < 0.95
    assert result.stop_tokens == harvested_at(iteration, CUDA_PROGRAM)


def test_a_draft_only_the_end_of_the_reasoning_completes_counts_at_the_think_end_tag() -> None:
    # Nothing after the program but the think-end tag: the loop reads the reasoning's end there.
    iteration = turn(PROSE * 20 + CUDA_PROGRAM, CUDA_PROGRAM)
    reasoning = iteration.reasoning.num_tokens
    tag = len(iteration.final.chunks[0].token_ids)       # the builder's answer opens with the tag
    assert harvested_at(iteration, CUDA_PROGRAM) == reasoning + tag
    result = turn_ceiling("scale", 0, iteration)
    assert result.stop_tokens == reasoning + tag < result.total_tokens
    assert result.draft_position == 1.0
    # The same program fenced, its fence closed by a last line with its newline, is harvested
    # with the reasoning's last chunk.
    fenced = turn(PROSE * 20 + f"```python\n{CUDA_PROGRAM}```\n", CUDA_PROGRAM)
    assert turn_ceiling("scale", 0, fenced).stop_tokens == harvested_at(fenced, CUDA_PROGRAM)
    assert turn_ceiling("scale", 0, fenced).draft_position == pytest.approx(1.0, abs=0.01)


def test_ceiling_and_loop_agree_on_generated_turns() -> None:
    library = CandidateLibrary.load()
    problems = sorted({c.problem for c in library.candidates})
    rng = random.Random("ceiling-agreement")
    checked = drafted = 0
    for index in range(24):
        problem = problems[index % len(problems)]
        reasoning, final_text, plan = generate_turn(problem, library, rng, LANGS)
        builder = TraceBuilder(token_rate=100.0, problem=problem, hand_written=False)
        builder.add_iteration(reasoning, forks=[], final_text=final_text)
        iteration = builder.build().iterations[0]
        final = final_text.split("```python\n", 1)[1].rsplit("```", 1)[0]
        result = turn_ceiling(problem, 0, iteration)
        loop = harvested_at(iteration, final)
        assert result.stop_tokens == (loop if loop is not None else result.total_tokens)
        checked += 1
        drafted += loop is not None
    assert checked == 24 and drafted > 0
    pooled, turns = ceiling([])
    assert pooled == 1.0 and turns == []


def test_the_named_ceiling_stops_at_the_first_naming_plus_the_forks_own_writing() -> None:
    # The kernel is named a third of the way in, never drafted: only a fork that writes can
    # stop early; it stops once the naming is read and the fork has written the answer.
    reasoning = (PROSE * 10 + "\nA kernel, scale_kernel, one thread per element.\n" + PROSE * 20)
    iteration = turn(reasoning, CUDA_PROGRAM)
    result = turn_ceiling("scale", 0, iteration)
    assert result.stop_tokens == result.total_tokens and result.draft_position is None
    offset = iteration.reasoning.text.index("scale_kernel")
    chars = read = 0
    for chunk in iteration.reasoning.chunks:        # the chunks a stream delivers past the name
        if chars > offset:
            break
        chars += len(chunk.text)
        read += len(chunk.token_ids)
    answer = iteration.final
    written = round(len(f"```python\n{CUDA_PROGRAM}```\n") * answer.num_tokens / len(answer.text))
    assert result.named_stop_tokens == read + written < result.total_tokens
    assert 0.25 < result.named_position < 0.45
    assert pooled([result]) == pytest.approx(result.named_stop_tokens / result.total_tokens)
    assert pooled([result], "stop_tokens") == 1.0


def test_the_named_ceiling_is_never_later_than_the_draft_and_counts_a_nameless_turn_in_full() -> None:
    drafted = turn(PROSE * 20 + f"```python\n{CUDA_PROGRAM}```\n" + AFTER + PROSE * 20, CUDA_PROGRAM)
    result = turn_ceiling("scale", 0, drafted)
    assert result.draft_position is not None
    assert result.named_stop_tokens <= result.stop_tokens
    nameless = turn(PROSE * 30, CUDA_PROGRAM)
    result = turn_ceiling("scale", 0, nameless)
    assert result.named_stop_tokens == result.total_tokens and result.named_position is None
    # Named only at the end: the fork writes the program alone, not the answer's prose around it.
    late = turn(PROSE * 30 + "scale_kernel", CUDA_PROGRAM)
    result = turn_ceiling("scale", 0, late)
    assert late.reasoning.num_tokens < result.named_stop_tokens < result.total_tokens


def test_share_of_saving() -> None:
    assert share_of_saving(0.9, 0.8) == pytest.approx(0.5)
    assert share_of_saving(1.1, 0.8) == pytest.approx(-0.5)
    assert share_of_saving(0.9, 1.0) is None and share_of_saving(None, 0.8) is None
