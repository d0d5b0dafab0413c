"""The engines a job can generate with, in one registry: a typed engine spec to an `Engine`.

A job's engine is an `EngineSpec`: a tagged union of one struct per registered engine, told apart
by its `llm` field (`ReplaySpec`, `VllmSpec`, `OpenAISpec` here). It is built once from the command
line (`specgen/cli/optimize_job.py`), travels inside the job as its builtins (`options["engine"]`, see
`optimize/job.py`) and is decoded back, strictly, where the loop runs (a scheduler job's reasoner,
in whatever cluster): an unknown field, a missing required one or a wrong type is an error that
names it, and `--llm` offers what is registered. `build_engine` turns the spec into the engine.

Adding an engine is a module with its spec struct and its builder and one `register_engine(...)`
line (docs/engines.md, "Adding an engine"): `build(spec, problem_name)` gets the spec, decoded. A
module outside specgen is a plug-in, named to every process by `runtime/plugins.py`.
"""
from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from specgen.errors import UsageError
from specgen.kv.engine_config import DEFAULT_POOL_GIB

if TYPE_CHECKING:
    from specgen.engines.base import Engine


class EngineSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="llm"):
    """What every engine's spec has; each registered engine subclasses it with its tag."""

    tokenizer: str | None = None            # a tokenizer directory, where the engine's own is not it


class ReplaySpec(EngineSpec, tag="replay"):
    trace: str | None = None                # a trace file; None: the problem's bundled one
    speed: float = 1.0                      # modelled time runs this much faster than the timing model
    fork_model: str = "scripted"            # what forks write (optimize/fork_models.py)
    timing: list[str] = []                  # timing-model overrides, NAME=VALUE


class VllmSpec(EngineSpec, tag="vllm"):
    model: str                              # a local model directory
    kv_pool: str = "auto"                   # where the KV pool goes (kv/engine_config.py)
    kv_pool_gib: float = DEFAULT_POOL_GIB


class OpenAISpec(EngineSpec, tag="openai"):
    base_url: str
    model: str
    tokenizer: str                          # the served model's tokenizer: token ids cross the wire


@dataclass(frozen=True)
class EngineKind:
    name: str
    spec: type[EngineSpec]
    build: Callable[[Any, str], "Engine"]
    summary: str = ""

    @property
    def keys(self) -> frozenset[str]:
        """The fields its spec takes, "llm" included."""
        return frozenset(self.spec.__struct_fields__) | {"llm"}

    @property
    def required(self) -> frozenset[str]:
        return frozenset(f.name for f in msgspec.structs.fields(self.spec) if f.required)


ENGINES: dict[str, EngineKind] = {}


def register_engine(spec: type[EngineSpec], build: Callable[[Any, str], "Engine"], *,
                    summary: str = "") -> EngineKind:
    """Offer an engine under its spec's tag (`--llm NAME`, `options["engine"]["llm"]`)."""
    name = spec.__struct_config__.tag
    if not issubclass(spec, EngineSpec):
        raise ValueError(f"{spec.__name__} must subclass EngineSpec (its tag is its --llm name)")
    if name in ENGINES:
        raise ValueError(f"engine {name!r} is already registered")
    ENGINES[name] = kind = EngineKind(name, spec, build, summary)
    return kind


def engine_spec(raw: Any, where: str = "options['engine']") -> EngineSpec:
    """The spec `raw` (its builtins, or a spec) describes, checked: no "llm" means replay."""
    if isinstance(raw, EngineSpec):
        return raw
    if not isinstance(raw, dict):
        raise UsageError(f"{where} must be a mapping, got {type(raw).__name__}")
    raw = {"llm": "replay", **raw}
    if raw["llm"] not in ENGINES:
        from specgen.runtime.plugins import unknown_name_hint

        # In a job's reasoner the likeliest cause is a plug-in's engine this process never loaded.
        raise UsageError(f"{where}['llm'] must be one of {', '.join(ENGINES)}, got {raw['llm']!r} "
                         f"({unknown_name_hint()})")
    missing = sorted(ENGINES[raw["llm"]].required - {k for k, v in raw.items() if v is not None})
    if missing:   # all of them at once (the decoder names the first only)
        raise UsageError(f"{where} for {raw['llm']} needs {', '.join(missing)}")
    union = typing.Union[tuple(kind.spec for kind in ENGINES.values())]  # type: ignore[valid-type]
    try:
        return msgspec.convert(raw, union)
    except msgspec.ValidationError as exc:
        raise UsageError(f"{where} for {raw['llm']}: {exc}") from None


def build_engine(raw: Any, problem_name: str, where: str = "options['engine']") -> "Engine":
    """The engine `raw` describes, its spec checked first."""
    spec = engine_spec(raw, where)
    return ENGINES[spec.__struct_config__.tag].build(spec, problem_name)


def _replay(spec: ReplaySpec, problem_name: str) -> "Engine":
    from specgen.traces.bundled import bundled_trace
    from specgen.traces.pinned_replay import IterationReplayEngine

    trace = spec.trace or bundled_trace(problem_name)
    if trace is None:
        raise UsageError(f"options['engine'] names no trace and {problem_name!r} has no bundled one")
    if not spec.speed > 0:
        raise UsageError(f"--speed must be > 0, got {spec.speed}")
    if spec.fork_model == "scripted":
        return IterationReplayEngine(trace, speed=spec.speed, tokenizer=spec.tokenizer)
    from specgen.engines.timing_model import TimingModel
    from specgen.optimize.fork_models import fork_writer
    from specgen.traces.pinned_replay import IterationModelledEngine

    try:
        writer = fork_writer(spec.fork_model)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return IterationModelledEngine(trace, writer, timing=TimingModel.from_overrides(list(spec.timing)),
                                   speed=spec.speed, tokenizer=spec.tokenizer)


def _vllm(spec: VllmSpec, problem_name: str) -> "Engine":
    from specgen.engines.vllm_engine import command_line_engine

    return command_line_engine(spec.model, tokenizer=spec.tokenizer)


def _openai(spec: OpenAISpec, problem_name: str) -> "Engine":
    from specgen.engines.openai_http import OpenAICompatEngine

    return OpenAICompatEngine(spec.base_url, spec.model, tokenizer=spec.tokenizer)


register_engine(ReplaySpec, _replay, summary="a recorded or generated trace, paced by the timing model")
register_engine(VllmSpec, _vllm, summary="vLLM's engine in this process")
register_engine(OpenAISpec, _openai, summary="an OpenAI-compatible server (/v1/completions with token ids)")
