"""The engine registry: one typed description of a job's engine, checked and built in one place."""
from __future__ import annotations

import msgspec
import pytest

from specgen.errors import UsageError
from specgen.optimize import engine_kinds
from specgen.optimize.engine_kinds import ENGINES, EngineSpec, ReplaySpec, build_engine, engine_spec, register_engine


def test_the_registered_engines_and_their_fields() -> None:
    assert list(ENGINES) == ["replay", "vllm", "openai"]
    assert ENGINES["openai"].required == {"base_url", "model", "tokenizer"}
    with pytest.raises(UsageError, match="for vllm: Object contains unknown field `base_url`"):
        build_engine({"llm": "vllm", "model": "m", "base_url": "u"}, "p")
    with pytest.raises(UsageError, match="the engine for vllm needs model"):
        build_engine({"llm": "vllm"}, "p", where="the engine")
    with pytest.raises(UsageError, match="Expected `float`, got `str` - at `\\$.speed`"):
        engine_spec({"llm": "replay", "speed": "fast"})
    with pytest.raises(UsageError, match="\\['llm'\\] must be one of replay, vllm, openai, got 'gpt'"):
        engine_spec({"llm": "gpt"})
    with pytest.raises(UsageError, match="--speed must be > 0, got 0.0"):
        build_engine({"llm": "replay", "speed": 0}, "fused_elementwise")
    with pytest.raises(UsageError, match="unknown fork model 'guess'"):
        build_engine({"llm": "replay", "fork_model": "guess"}, "fused_elementwise")


def test_a_spec_travels_as_its_builtins_and_comes_back_the_same() -> None:
    spec = ReplaySpec(trace="/t.json", speed=2.0, fork_model="draft", timing=["r1=40"])
    raw = msgspec.to_builtins(spec)
    assert raw["llm"] == "replay" and engine_spec(raw) == spec
    assert engine_spec({}) == ReplaySpec()          # no "llm": the replay of the problem's trace


class FastReplaySpec(EngineSpec, tag="fast-replay"):
    speed: float = 100.0


def test_a_new_engine_is_one_spec_one_builder_and_one_registration() -> None:
    """The worked example of docs/engines.md: an engine registered once is offered by
    `specgen optimize --llm`, `specgen bench --llm` and a scheduler job's options alike."""
    from specgen.cli import build_parser
    from specgen.optimize.job import engine_from_options
    from specgen.traces.bundled import bundled_trace
    from specgen.traces.pinned_replay import IterationReplayEngine

    def fast_replay(spec: FastReplaySpec, problem_name: str) -> IterationReplayEngine:
        return IterationReplayEngine(bundled_trace(problem_name), speed=spec.speed)

    register_engine(FastReplaySpec, fast_replay)
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_engine(FastReplaySpec, fast_replay)
        parsed = build_parser().parse_args(["optimize", "--llm", "fast-replay"])
        assert parsed.llm == "fast-replay"
        assert build_parser().parse_args(["bench", "--llm", "fast-replay", "--generate", "1"]).llm == "fast-replay"
        engine = engine_from_options({"engine": {"llm": "fast-replay"}}, "fused_elementwise")
        assert isinstance(engine, IterationReplayEngine) and engine.speed == 100
        with pytest.raises(UsageError, match="unknown field `model`"):
            engine_from_options({"engine": {"llm": "fast-replay", "model": "m"}}, "fused_elementwise")
    finally:
        engine_kinds.ENGINES.pop("fast-replay", None)

