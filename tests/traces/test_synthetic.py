"""The trace generator drafts as the measured statistics say, counted with the loop's extractor."""
from __future__ import annotations

import random
import statistics

import pytest

from specgen.traces.extraction import extract_candidate, find_drafts, kernel_bodies
from specgen.traces.synthetic import (
    CHARS_PER_TOKEN,
    LANGS,
    CandidateLibrary,
    generate_traces,
    generate_turn,
)


def _quantile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


@pytest.fixture(scope="module")
def generated():
    """400 turns over every bundled problem, as `generate_traces` draws them (without building
    the traces' token timing, which only re-tokenizes the same text)."""
    library = CandidateLibrary.load()
    problems = sorted({c.problem for c in library.candidates})
    rng = random.Random("synthetic-statistics")
    turns = []
    for index in range(400):
        reasoning, final, plan = generate_turn(problems[index % len(problems)], library, rng, LANGS)
        turns.append((reasoning, find_drafts(reasoning), final, plan))
    return turns


def test_the_extractor_finds_exactly_the_planned_drafts(generated) -> None:
    for text, drafts, _, plan in generated:
        assert sorted(b.fenced for b in drafts) == sorted(fenced for _, _, fenced in plan.drafts)
        # Each ends about where it was planned to, or later where it would overlap the text
        # before it (then two drafts may swap places).
        size = plan.reasoning_tokens * CHARS_PER_TOKEN
        ends = sorted(b.end / size for b in drafts)
        planned = sorted(position for position, _, _ in plan.drafts)
        assert all(end >= position - 0.02 for end, position in zip(ends, planned))


def test_drafts_per_trace_follow_the_measured_counts(generated) -> None:
    # Measured: p10 / p50 / p90 0 / 1 / 2, mean 1.27, none in 15% of traces.
    counts = [len(drafts) for _, drafts, _, _ in generated]
    assert len(counts) == 400
    assert (_quantile(counts, 0.1), statistics.median(counts), _quantile(counts, 0.9)) == (0, 1, 2)
    assert 1.05 < statistics.mean(counts) < 1.5
    assert 0.09 < counts.count(0) / len(counts) < 0.22
    # Real traces write many drafts without a fence (21 of 39 final-kernel drafts fenced).
    fenced = [b.fenced for _, drafts, _, _ in generated for b in drafts]
    assert 0.40 < sum(fenced) / len(fenced) < 0.68
    no_fenced = sum(not any(b.fenced for b in d) for _, d, _, _ in generated) / len(generated)
    assert 0.33 < no_fenced < 0.55                     # measured 41 of 96 turns


def test_first_draft_positions_follow_the_measured_ones(generated) -> None:
    firsts = [drafts[0].end / len(text) for text, drafts, _, _ in generated if drafts]
    every = [b.end / len(text) for text, drafts, _, _ in generated for b in drafts]
    # Measured: first 34% / 86% / 100%, every draft 46% / 90% / 99%.
    assert 0.22 < _quantile(firsts, 0.1) < 0.48
    assert 0.76 < statistics.median(firsts) < 0.93
    assert _quantile(firsts, 0.9) > 0.93
    assert 0.33 < _quantile(every, 0.1) < 0.58 and 0.8 < statistics.median(every) < 0.95
    # Measured: a complete draft before 25% / 50% / 75% of the reasoning in 6% / 13% / 27%.
    for position, measured in ((0.25, 0.06), (0.5, 0.13), (0.75, 0.27)):
        share = sum(1 for p in firsts if p < position) / len(generated)
        assert measured / 2 - 0.02 < share < measured * 1.6 + 0.02, (position, share)


def test_fragments_and_final_kernel_drafts_follow_the_measured_shares(generated) -> None:
    fragments = [plan.fragments for _, _, _, plan in generated]
    assert 3 <= statistics.median(fragments) <= 7                   # measured median 5
    assert 0.74 < sum(1 for f in fragments if f) / len(fragments) < 0.93   # measured 84%
    correct = [(text, drafts, final) for text, drafts, final, plan in generated if plan.correct]
    drafted = []
    for text, drafts, final in correct:
        target = kernel_bodies(extract_candidate(final, accept_unclosed=True))
        ends = [b.end / len(text) for b in drafts if kernel_bodies(b.source) == target]
        if ends:
            drafted.append(ends[0])
    # Measured: 58% of correct traces, at 71% / 92% / 97%.
    assert 0.4 < len(drafted) / len(correct) < 0.75
    assert 0.82 < statistics.median(drafted) < 0.97


def test_generation_is_deterministic_per_seed() -> None:
    problems = ["softmax", "layernorm"]
    first, plans = generate_traces(problems, 3, seed=5)
    again, plans_again = generate_traces(problems, 3, seed=5)
    other, _ = generate_traces(problems, 3, seed=6)
    assert [t.to_json()["iterations"] for t in first] == [t.to_json()["iterations"] for t in again]
    assert plans == plans_again
    assert [t.to_json()["iterations"] for t in first] != [t.to_json()["iterations"] for t in other]
