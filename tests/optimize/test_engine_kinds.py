"""The engine registry: one description of a job's engine, checked and built in one place."""
from __future__ import annotations

import pytest

from specgen.errors import UsageError
from specgen.optimize import engine_kinds
from specgen.optimize.engine_kinds import ENGINES, build_engine, register_engine


def test_the_registered_engines_and_their_keys() -> None:
    assert list(ENGINES) == ["replay", "vllm", "openai"]
    assert ENGINES["openai"].required == {"base_url", "model", "tokenizer"}
    with pytest.raises(UsageError, match="for vllm: unknown key\\(s\\) base_url"):
        build_engine({"llm": "vllm", "model": "m", "base_url": "u"}, "p")
    with pytest.raises(UsageError, match="the engine for vllm needs model"):
        build_engine({"llm": "vllm"}, "p", where="the engine")
    with pytest.raises(UsageError, match="--speed must be > 0, got 0.0"):
        build_engine({"llm": "replay", "speed": 0}, "fused_elementwise")
    with pytest.raises(UsageError, match="unknown fork model 'guess'"):
        build_engine({"llm": "replay", "fork_model": "guess"}, "fused_elementwise")


def test_a_new_engine_is_one_builder_and_one_registration() -> None:
    """The worked example of docs/engines.md: an engine registered once is offered by
    `specgen optimize --llm`, `specgen bench --llm` and a scheduler job's options alike."""
    from specgen.cli import build_parser
    from specgen.optimize.job import engine_from_options
    from specgen.traces.bundled import bundled_trace
    from specgen.traces.pinned_replay import IterationReplayEngine

    def fast_replay(options, problem_name):
        return IterationReplayEngine(bundled_trace(problem_name), speed=float(options.get("speed", 100)))

    register_engine("fast-replay", fast_replay, keys=("speed",))
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_engine("fast-replay", fast_replay)
        parsed = build_parser().parse_args(["optimize", "--llm", "fast-replay"])
        assert parsed.llm == "fast-replay"
        assert build_parser().parse_args(["bench", "--llm", "fast-replay", "--generate", "1"]).llm == "fast-replay"
        engine = engine_from_options({"engine": {"llm": "fast-replay"}}, "fused_elementwise")
        assert isinstance(engine, IterationReplayEngine) and engine.speed == 100
        with pytest.raises(UsageError, match="unknown key\\(s\\) model"):
            engine_from_options({"engine": {"llm": "fast-replay", "model": "m"}}, "fused_elementwise")
    finally:
        engine_kinds.ENGINES.pop("fast-replay", None)
