"""The ceiling of draft harvesting, reported with every run on traces.

For each turn: the earliest position where the reasoning holds a complete draft whose kernels are
the final answer's (white space removed, `extraction.kernel_bodies`). Stopping there at zero cost
is the best any mechanism that only harvests drafts can do; the pooled ratio is the stopped tokens
over all turns' tokens (reasoning + answer), i.e. the share of sequential time left at a constant
decode rate. A turn with no such draft counts in full.
"""
from __future__ import annotations

from dataclasses import dataclass

from specgen.engines.trace import Iteration, Trace
from specgen.optimize.extraction import extract_candidate, find_code_blocks, kernel_bodies


@dataclass
class TurnCeiling:
    problem: str
    turn: int
    total_tokens: int                   # reasoning + answer
    stop_tokens: int                    # where a zero-cost harvester could stop
    draft_position: float | None        # share of the reasoning where that draft ends; None: none


def _tokens_before(iteration: Iteration, offset: int) -> int:
    """Reasoning tokens whose text ends at or before `offset` (chunk granularity)."""
    chars = tokens = 0
    for chunk in iteration.reasoning.chunks:
        if chars + len(chunk.text) > offset:
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
        for block in find_code_blocks(iteration.reasoning.text):
            if block.closed and block.is_candidate and kernel_bodies(block.source) == target:
                stop = _tokens_before(iteration, block.end)
                return TurnCeiling(problem, turn, total, stop, stop / max(1, reasoning))
    return TurnCeiling(problem, turn, total, total, None)


def ceiling(traces: list[Trace]) -> tuple[float, list[TurnCeiling]]:
    """(pooled ratio, per turn) over every iteration of `traces`."""
    turns = [turn_ceiling(t.metadata.problem, i, it) for t in traces
             for i, it in enumerate(t.iterations)]
    total = sum(t.total_tokens for t in turns)
    return (sum(t.stop_tokens for t in turns) / total if total else 1.0), turns
