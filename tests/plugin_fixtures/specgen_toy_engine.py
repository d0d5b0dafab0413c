"""A toy engine: one module and one registration, loaded as a plug-in (`SPECGEN_PLUGINS` names
`specgen_toy_engine`, the module form: importing it registers the engine).

It replays the problem's bundled trace under its own name, `toy`, on the timing model; its forks are
written by the fork model its spec names, looked up in the registry where the engine is built (the
job's reasoner), so a plug-in's fork model must be loaded there too."""
from __future__ import annotations

from specgen.engines.timing_model import TimingModel
from specgen.errors import UsageError
from specgen.optimize.engine_kinds import EngineSpec, register_engine
from specgen.optimize.fork_models import fork_writer
from specgen.traces.bundled import bundled_trace
from specgen.traces.pinned_replay import IterationModelledEngine


class ToySpec(EngineSpec, tag="toy"):
    fork_model: str = "toy-fork"
    speed: float = 50.0


class ToyEngine(IterationModelledEngine):
    name = "toy"


def toy_engine(spec: ToySpec, problem_name: str) -> ToyEngine:
    trace = bundled_trace(problem_name)
    if trace is None:
        raise UsageError(f"the toy engine replays bundled traces only; {problem_name!r} has none")
    return ToyEngine(trace, fork_writer(spec.fork_model), timing=TimingModel(), speed=spec.speed)


register_engine(ToySpec, toy_engine, summary="a bundled trace replayed as 'toy' (a test's plug-in)")
