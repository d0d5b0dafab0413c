"""Building a simulation: GPUs split into reasoning engines and evaluation workers, jobs over the
problems whose service times were measured."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from specgen.engines.timing_model import TimingModel
from specgen.errors import UsageError
from specgen.messages import TriggerSettings
from specgen.simulate.model import ServiceTimes, TurnBank
from specgen.simulate.simulation import JobPlan, SimConfig, Simulation
from specgen.traces.synthetic import CandidateLibrary

# GPUs per reasoning engine: the tensor-parallel degree the TimingModel's default decode curve was
# measured at (TP8, see specgen/engines/timing_model.py).
ENGINE_GPUS = 8
TURNS_PER_PROBLEM = 12     # generated turns per problem in the bank the jobs draw from


def split_gpus(gpus: int, eval_fraction: float | None = None, eval_gpus: int | None = None,
               engine_gpus: int = ENGINE_GPUS) -> tuple[int, int]:
    """(evaluation workers, reasoning engines). Fewer reasoning GPUs than one engine's make one
    smaller engine (the decode curve is then the same per request: an assumption)."""
    if eval_gpus is None:
        if eval_fraction is None or not 0 < eval_fraction < 1:
            raise UsageError("--eval-fraction must lie strictly between 0 and 1")
        eval_gpus = max(1, round(gpus * eval_fraction))
    reasoning = gpus - eval_gpus
    if eval_gpus < 1 or reasoning < 1:
        raise UsageError(f"{gpus} GPUs: need at least one evaluation GPU and one reasoning GPU "
                         f"(asked for {eval_gpus} evaluation GPUs)")
    return eval_gpus, max(1, reasoning // engine_gpus)


def build(gpus: int, jobs: int, service: ServiceTimes, *, eval_fraction: float | None = 0.5,
          eval_gpus: int | None = None, elastic: bool = True, hours: float = 1.0, seed: int = 0,
          mode: str = "specgen", timing: TimingModel | None = None, problems: list[str] | None = None,
          bank: TurnBank | None = None, turns: int = 4, settings: dict[str, Any] | None = None,
          library: CandidateLibrary | None = None) -> Simulation:
    n_eval, engines = split_gpus(gpus, eval_fraction, eval_gpus)
    problems = problems or sorted(service.durations)
    if not problems:
        raise UsageError("no problems with measured service times")
    bank = bank or TurnBank(problems, TURNS_PER_PROBLEM, seed, TriggerSettings(), library)
    cfg = SimConfig(eval_gpus=n_eval, reasoning_engines=engines, elastic=elastic, hours=hours,
                    seed=seed, timing=timing or TimingModel(), turns=turns,
                    settings=dict(settings or {}))
    plans = [JobPlan(job_id=f"job{i}", problem=problems[i % len(problems)], mode=mode,
                     engine=i % engines) for i in range(jobs)]
    return Simulation(cfg, service, bank, plans)


def bench_problems(path: Path) -> list[str]:
    from specgen.simulate.model import base_problem, load_bench

    data = load_bench(path)
    return sorted({base_problem(p["name"]) for p in data["config"]["problems"]})
