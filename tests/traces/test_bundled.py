"""The bundled example problems and their hand-written traces."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specgen.eval.loader import load_candidate, load_problem
from specgen.traces.bundled import (
    DEFAULT_PROBLEM,
    bundled_problem,
    bundled_problems,
    bundled_trace,
    bundled_traces,
)
from specgen.traces.extraction import extract_candidate, extract_fork_candidate
from specgen.traces.format import Trace

from .conftest import TRACE_SOURCES

REPO = Path(__file__).resolve().parents[2]


def test_at_least_two_problems_have_traces_and_the_default_is_one() -> None:
    traces = bundled_traces()
    assert len(traces) >= 2 and DEFAULT_PROBLEM in traces
    assert set(traces) <= set(bundled_problems())


@pytest.mark.parametrize("name", sorted(bundled_traces()))
def test_traces_are_marked_hand_written_and_look_like_reasoning(name: str) -> None:
    trace = Trace.load(bundled_trace(name))
    meta = trace.metadata
    assert meta.hand_written and meta.model == "hand-written" and meta.token_rate == 50
    assert meta.problem == name and "Hand-written" in meta.notes
    problem = load_problem(bundled_problem(name))
    for iteration in trace.iterations:
        reasoning = iteration.reasoning
        assert reasoning.num_tokens >= 3000               # thousands of tokens
        # Timing comes from the stated rate: one token every 1/50 s after the first.
        assert reasoning.duration_s == pytest.approx(
            reasoning.chunks[0].t + (reasoning.num_tokens - 1) / meta.token_rate, rel=0.01)
        assert len(iteration.forks) >= 3
        # The final answer is a real candidate; so is every fork's program.
        final = extract_candidate(iteration.final.text)
        assert final is not None and load_candidate(final, problem)
        for fork in iteration.forks:
            source = extract_fork_candidate(fork.completion.text, opened_fence=True)
            assert source is not None and load_candidate(source, problem)


def test_bundled_traces_are_up_to_date_with_their_sources() -> None:
    done = subprocess.run([sys.executable, str(REPO / "tools" / "make_traces.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("up to date") == len(list(TRACE_SOURCES.glob("*.md")))
