"""The ceiling of draft harvesting, reported with every run on traces.

For each turn: the earliest position where the loop's own scanner (`extraction.CodeBlockScanner`,
which the inline-candidate trigger runs on the streaming reasoning) has reported a complete draft,
fenced or not, whose kernels are the final answer's (white space removed,
`extraction.kernel_bodies`). Stopping there at zero cost is the best any mechanism that only
harvests drafts can do; the pooled ratio is the stopped tokens over all turns' tokens (reasoning +
answer), i.e. the share of sequential time left at a constant decode rate. A turn with no such
draft counts in full.

The reasoning is read as the loop reads it: a draft counts from the chunk that delivers the text
showing it has ended (the closing fence, the first words of the prose after an unfenced program);
a draft that only the end of the reasoning completes (the scanner's `finish`, which the loop calls
when the think-end tag arrives) counts from the chunk of the answer that delivers the tag.

Beside it, the **named ceiling** (the bound of forks that write): stop where the final answer's
kernel is first named in the reasoning (`extraction.first_naming`, the point from which the `named`
fork model writes the answer), plus that fork's own writing of the answer program (its tokens at
the same rate, in the trace's tokens; the fork's prefill is on a cached prefix and counted as nothing). A turn that never
names the answer's kernel, or whose fork would finish later than the turn itself, counts in full.
In both ceilings the evaluation of the answer is left out of both sides: it waits in no queue, and
takes the same time whichever way the answer came.
"""
from __future__ import annotations

from dataclasses import dataclass

from specgen.traces.extraction import (CodeBlock, CodeBlockScanner, extract_candidate, first_naming,
                                         kernel_bodies)
from specgen.traces.format import Iteration, Trace


@dataclass
class TurnCeiling:
    problem: str
    turn: int
    total_tokens: int                   # reasoning + answer
    stop_tokens: int                    # where a zero-cost harvester could stop
    draft_position: float | None        # share of the reasoning the loop had read by then; None: none
    named_stop_tokens: int = 0          # where a fork from the first naming would have written it
    named_position: float | None = None  # share of the reasoning read at the first naming; None: none


def _tokens_through(iteration: Iteration, offset: int) -> int:
    """Reasoning tokens of the chunks a stream needs to have delivered `offset` characters."""
    chars = tokens = 0
    for chunk in iteration.reasoning.chunks:
        if chars >= offset:
            break
        chars += len(chunk.text)
        tokens += len(chunk.token_ids)
    return tokens


def _tag_tokens(iteration: Iteration, think_end: str) -> int:
    """Answer tokens of the chunks a stream needs to have delivered the think-end tag (all of
    them when the answer has none: then only the stream's end ends the reasoning)."""
    text, tokens = "", 0
    for chunk in iteration.final.chunks:
        text += chunk.text
        tokens += len(chunk.token_ids)
        if think_end in text:
            break
    return tokens


def _harvests(iteration: Iteration, think_end: str) -> list[tuple[CodeBlock, int]]:
    """Each draft the loop harvests from the reasoning, in order, with the tokens delivered when
    it does: while the reasoning streams, or when its end arrives."""
    text = iteration.reasoning.text
    scanner = CodeBlockScanner()
    found = [(block, _tokens_through(iteration, block.known_at)) for block in scanner.feed(text)]
    at_end = iteration.reasoning.num_tokens + _tag_tokens(iteration, think_end)
    found += [(block, at_end) for block in scanner.finish(text)]
    return [(block, tokens) for block, tokens in found if block.is_candidate]


def _named_stop(iteration: Iteration, final: str, total: int) -> tuple[int, float | None]:
    """(stop tokens, naming position) of the named ceiling; (total, None) without a naming."""
    named = first_naming(iteration.reasoning.text, final)
    if named is None:
        return total, None
    read = _tokens_through(iteration, named + 1)        # the fork model writes once past it
    # The answer program's tokens in the trace's own unit: its characters at the answer's density.
    answer = iteration.final
    written = round(len(f"```python\n{final}```\n") * answer.num_tokens / max(1, len(answer.text)))
    reasoning = iteration.reasoning.num_tokens
    return min(total, read + written), read / max(1, reasoning)


def turn_ceiling(problem: str, turn: int, iteration: Iteration,
                 think_end: str = "</think>") -> TurnCeiling:
    reasoning = iteration.reasoning.num_tokens
    total = reasoning + iteration.final.num_tokens
    final = extract_candidate(iteration.final.text, accept_unclosed=True)
    if final is None:
        return TurnCeiling(problem, turn, total, total, None, total, None)
    named_stop, named_position = _named_stop(iteration, final, total)
    target = kernel_bodies(final)
    for draft, stop in _harvests(iteration, think_end):
        if kernel_bodies(draft.source) == target:
            return TurnCeiling(problem, turn, total, stop, min(stop, reasoning) / max(1, reasoning),
                               min(named_stop, stop), named_position)
    return TurnCeiling(problem, turn, total, total, None, named_stop, named_position)


def ceiling(traces: list[Trace]) -> tuple[float, list[TurnCeiling]]:
    """(pooled ratio of the draft ceiling, per turn) over every iteration of `traces`."""
    turns = [turn_ceiling(t.metadata.problem, i, it, t.metadata.think_end) for t in traces
             for i, it in enumerate(t.iterations)]
    return pooled(turns, "stop_tokens"), turns


def pooled(turns: list[TurnCeiling], stop: str = "named_stop_tokens") -> float:
    """Stopped tokens over all tokens (`stop`: which ceiling's stops): 1.0 for no turns."""
    total = sum(t.total_tokens for t in turns)
    return sum(getattr(t, stop) for t in turns) / total if total else 1.0


def share_of_saving(ratio: float | None, bound: float) -> float | None:
    """How much of a ceiling's saving a measured ratio achieved: (1 - ratio) / (1 - bound); None
    where the ceiling saves nothing."""
    if ratio is None or bound >= 1.0:
        return None
    return (1.0 - ratio) / (1.0 - bound)
