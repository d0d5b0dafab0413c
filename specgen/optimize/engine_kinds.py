"""The engines a job can generate with, in one registry: `{"llm": NAME, ...}` to an `Engine`.

A job's engine travels as a plain mapping (`options["engine"]`, see `optimize/job.py`), built once
from the command line (`commands._engine_options`) and turned into an engine where the loop runs:
in `specgen optimize`'s own process, or in a scheduler job's reasoner. Both go through
`build_engine`, so an engine is checked and built in one place: its keys are known (an unknown key
is an error that names it), its required keys are present, and `--llm` offers what is registered.

Adding an engine is a module with its builder and one `register_engine(...)` line (docs/engines.md,
"Adding an engine"): `build(options, problem_name)` gets the mapping, checked.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specgen.errors import UsageError

if TYPE_CHECKING:
    from specgen.engines.base import Engine


@dataclass(frozen=True)
class EngineKind:
    name: str
    build: Callable[[dict[str, Any], str], "Engine"]
    keys: frozenset[str]            # the options it reads, "llm" included
    required: frozenset[str]        # of them, those it cannot do without
    summary: str = ""


ENGINES: dict[str, EngineKind] = {}


def register_engine(name: str, build: Callable[[dict[str, Any], str], "Engine"], *,
                    keys: tuple[str, ...] = (), required: tuple[str, ...] = (),
                    summary: str = "") -> EngineKind:
    """Offer an engine under `name` (`--llm NAME`, `options["engine"]["llm"]`)."""
    if name in ENGINES:
        raise ValueError(f"engine {name!r} is already registered")
    if not set(required) <= set(keys):
        raise ValueError(f"engine {name!r}: required keys {sorted(set(required) - set(keys))} "
                         "are not among its keys")
    ENGINES[name] = kind = EngineKind(name, build, frozenset(keys) | {"llm"}, frozenset(required),
                                      summary)
    return kind


def build_engine(raw: Any, problem_name: str, where: str = "options['engine']") -> "Engine":
    """The engine `raw` describes, checked against its registration first."""
    if not isinstance(raw, dict):
        raise UsageError(f"{where} must be a mapping, got {type(raw).__name__}")
    llm = raw.get("llm", "replay")
    kind = ENGINES.get(llm)
    if kind is None:
        raise UsageError(f"{where}['llm'] must be one of {', '.join(ENGINES)}, got {llm!r}")
    unknown = sorted(set(raw) - kind.keys)
    if unknown:
        raise UsageError(f"{where} for {llm}: unknown key(s) {', '.join(unknown)}")
    missing = sorted(k for k in kind.required if not raw.get(k))
    if missing:
        raise UsageError(f"{where} for {llm} needs {', '.join(missing)}")
    return kind.build(raw, problem_name)


def _replay(raw: dict[str, Any], problem_name: str) -> "Engine":
    from specgen.traces.bundled import bundled_trace
    from specgen.traces.pinned_replay import IterationReplayEngine

    trace = raw.get("trace") or bundled_trace(problem_name)
    if trace is None:
        raise UsageError(f"options['engine'] names no trace and {problem_name!r} has no bundled one")
    speed = float(raw.get("speed", 1.0))
    if not speed > 0:
        raise UsageError(f"--speed must be > 0, got {speed}")
    fork_model = raw.get("fork_model", "scripted")
    if fork_model == "scripted":
        return IterationReplayEngine(trace, speed=speed, tokenizer=raw.get("tokenizer"))
    from specgen.engines.timing_model import TimingModel
    from specgen.optimize.fork_models import fork_writer
    from specgen.traces.pinned_replay import IterationModelledEngine

    try:
        writer = fork_writer(fork_model)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return IterationModelledEngine(trace, writer,
                                   timing=TimingModel.from_overrides(list(raw.get("timing") or [])),
                                   speed=speed, tokenizer=raw.get("tokenizer"))


def _vllm(raw: dict[str, Any], problem_name: str) -> "Engine":
    from specgen.engines.vllm_engine import command_line_engine

    return command_line_engine(raw["model"], tokenizer=raw.get("tokenizer"))


def _openai(raw: dict[str, Any], problem_name: str) -> "Engine":
    from specgen.engines.openai_http import OpenAICompatEngine

    return OpenAICompatEngine(raw["base_url"], raw["model"], tokenizer=raw["tokenizer"])


register_engine("replay", _replay, keys=("trace", "speed", "tokenizer", "fork_model", "timing"),
                summary="a recorded or generated trace, paced by the timing model")
register_engine("vllm", _vllm, keys=("model", "tokenizer", "kv_pool", "kv_pool_gib"),
                required=("model",), summary="vLLM's engine in this process")
register_engine("openai", _openai, keys=("base_url", "model", "tokenizer"),
                required=("base_url", "model", "tokenizer"),
                summary="an OpenAI-compatible server (/v1/completions with token ids)")
