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
"""
from __future__ import annotations

from dataclasses import dataclass

from specgen.engines.trace import Iteration, Trace
from specgen.optimize.extraction import CodeBlock, CodeBlockScanner, extract_candidate, kernel_bodies


@dataclass
class TurnCeiling:
    problem: str
    turn: int
    total_tokens: int                   # reasoning + answer
    stop_tokens: int                    # where a zero-cost harvester could stop
    draft_position: float | None        # share of the reasoning the loop had read by then; None: none


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


def turn_ceiling(problem: str, turn: int, iteration: Iteration,
                 think_end: str = "</think>") -> TurnCeiling:
    reasoning = iteration.reasoning.num_tokens
    total = reasoning + iteration.final.num_tokens
    final = extract_candidate(iteration.final.text, accept_unclosed=True)
    if final is not None:
        target = kernel_bodies(final)
        for draft, stop in _harvests(iteration, think_end):
            if kernel_bodies(draft.source) == target:
                return TurnCeiling(problem, turn, total, stop,
                                   min(stop, reasoning) / max(1, reasoning))
    return TurnCeiling(problem, turn, total, total, None)


def ceiling(traces: list[Trace]) -> tuple[float, list[TurnCeiling]]:
    """(pooled ratio, per turn) over every iteration of `traces`."""
    turns = [turn_ceiling(t.metadata.problem, i, it, t.metadata.think_end) for t in traces
             for i, it in enumerate(t.iterations)]
    total = sum(t.total_tokens for t in turns)
    return (sum(t.stop_tokens for t in turns) / total if total else 1.0), turns
