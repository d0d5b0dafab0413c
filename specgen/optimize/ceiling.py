"""The ceiling of draft harvesting, reported with every run on traces.

For each turn: the earliest position where the loop's own scanner (`extraction.find_drafts`, the
`CodeBlockScanner` the inline-candidate trigger runs on the streaming reasoning) has reported a
complete draft, fenced or not, whose kernels are the final answer's (white space removed,
`extraction.kernel_bodies`). Stopping there at zero cost is the best any mechanism that only
harvests drafts can do; the pooled ratio is the stopped tokens over all turns' tokens (reasoning +
answer), i.e. the share of sequential time left at a constant decode rate. A turn with no such
draft counts in full.

The reasoning is read as the loop reads it: up to its think-end tag, which ends the stream without
the scanner's `finish`, so a draft that only the end of the reasoning would complete is not one
here either; and a draft counts from the chunk that delivers the text showing it has ended (the
closing fence, the first words of the prose after an unfenced program).
"""
from __future__ import annotations

from dataclasses import dataclass

from specgen.engines.trace import Iteration, Trace
from specgen.optimize.extraction import extract_candidate, find_drafts, kernel_bodies


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


def turn_ceiling(problem: str, turn: int, iteration: Iteration) -> TurnCeiling:
    reasoning = iteration.reasoning.num_tokens
    total = reasoning + iteration.final.num_tokens
    final = extract_candidate(iteration.final.text, accept_unclosed=True)
    if final is not None:
        target = kernel_bodies(final)
        for draft in find_drafts(iteration.reasoning.text, ended=False):
            if kernel_bodies(draft.source) == target:
                stop = _tokens_through(iteration, draft.known_at)
                return TurnCeiling(problem, turn, total, stop, stop / max(1, reasoning))
    return TurnCeiling(problem, turn, total, total, None)


def ceiling(traces: list[Trace]) -> tuple[float, list[TurnCeiling]]:
    """(pooled ratio, per turn) over every iteration of `traces`."""
    turns = [turn_ceiling(t.metadata.problem, i, it) for t in traces
             for i, it in enumerate(t.iterations)]
    total = sum(t.total_tokens for t in turns)
    return (sum(t.stop_tokens for t in turns) / total if total else 1.0), turns
