"""What a bench run is given (`BenchConfig`) and what both of its clocks take from it: the settings
as results.json records them, the label of the machines, every program the traces can submit, and
the builds of those programs ahead of the timed run."""
from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specgen.engines.timing_model import TimingModel
from specgen.traces.format import Trace
from specgen.optimize.bench_problems import BenchProblem
from specgen.optimize.fork_models import FORK_MODELS
from specgen.optimize.modes import MODES


@dataclass
class BenchConfig:
    problems: list[BenchProblem]
    modes: list[str] = field(default_factory=lambda: list(MODES))
    fork_model: str = "draft"
    timing: TimingModel = field(default_factory=TimingModel)
    speed: float = 1.0                       # modelled LLM time divided by this (not evaluation)
    concurrency: int = 1
    devices: list[str] = field(default_factory=lambda: ["cpu", "cpu"])
    prefix_cache: bool = True
    kv_pool: bool = False                    # with prefix_cache off: forks fetch the prefix from a pool
    time_budget_s: float | None = None       # per job, wall seconds
    target_speedup: float | None = None
    improvement_margin: float | None = 0.1   # a kernel beating the earlier ones by this ends its
    #                                          turn (the loop's default, OptimizeSpec); None: never
    best_of_n: int = 4
    drain_speculative: bool = False          # the jobs wait for speculative verdicts at their end
    eval_options: dict[str, Any] = field(default_factory=dict)
    runtime_settings: list[str] = field(default_factory=list)
    live_engine: Any = None                  # for fork model "model"
    fork_max_tokens: int = 2048              # a live engine's fork length cap (fork model "model")
    fork_engine: dict[str, str] | None = None  # that engine's description (--llm, --model, ...)
    label: str = ""
    cache_dir: Path | None = None            # evaluation cache shared by every mode's cluster
    # False (the default): every mode's run starts with none of the traces' extensions built and
    # waits for each build where a live run would, on both clocks. True: all are built before the
    # timed run and no mode's times hold a build.
    prebuild: bool = False

    def check(self) -> None:
        from specgen.errors import UsageError

        if not self.problems:
            raise UsageError("bench: no problems (give traces, --generate N or --problems)")
        unknown = [m for m in self.modes if m not in MODES]
        if unknown:
            raise UsageError(f"bench: unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
        if self.fork_model not in FORK_MODELS:
            raise UsageError(f"bench: --fork-model must be one of {', '.join(FORK_MODELS)}")
        if self.concurrency < 1 or not self.speed > 0:
            raise UsageError("bench: --concurrency must be >= 1 and --speed > 0")
        if self.fork_max_tokens < 1:
            raise UsageError("bench: --fork-max-tokens must be >= 1")
        if self.improvement_margin is not None and self.improvement_margin < 0:
            raise UsageError(f"bench: --margin must be >= 0, got {self.improvement_margin}")
        # Results are kept per (mode, name): a second entry of one name would hide the first.
        names = [p.name for p in self.problems]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise UsageError(f"bench: problem name(s) {', '.join(repeated)} given more than once "
                             "(traces and --generate of one problem?); bench them separately")


def hardware_label(devices: list[str]) -> str:
    """The machines as they are: distinct GPUs counted once (workers sharing one are not GPUs)."""
    if any(d.startswith("cuda") for d in devices):
        gpus = len({d for d in devices if d.startswith("cuda")})
        try:
            import torch

            return f"{gpus} x {torch.cuda.get_device_name(0)} (GPU timing)"
        except Exception:  # noqa: BLE001 - the label is informative only
            return f"{gpus} GPU(s) (GPU timing)"
    return f"{len(devices)} CPU worker(s) on {platform.node()} (CPU timing: says nothing about GPUs)"


def programs_in(trace: Trace) -> list[str]:
    """Every complete ModelNew program a trace's reasoning drafts (fenced or not, as the loop's
    inline-candidate trigger finds them) or its answers give."""
    from specgen.traces.extraction import extract_candidate, find_drafts

    found: dict[str, None] = {}
    for iteration in trace.iterations:
        # ended: the loop also harvests what the end of the reasoning completes.
        for block in find_drafts(iteration.reasoning.text, ended=True):
            found[block.source] = None
        final = extract_candidate(iteration.final.text, accept_unclosed=True)
        if final:
            found[final] = None
    return list(found)


def build_products(cache_dir: Path) -> Path:
    """Where the evaluation service keeps its finished extension builds under a cache folder."""
    return cache_dir / "ext"


def forget_builds(config: BenchConfig) -> None:
    """Remove the finished builds from the shared cache, so that the next run pays its builds as a
    user's first run does. The reference timings, Triton's cache and the machine's precompiled
    headers (eval/pch.py: made once per machine, not per run) stay."""
    if config.cache_dir is None or not build_products(config.cache_dir).is_dir():
        return
    for entry in build_products(config.cache_dir).iterdir():
        if entry.name == "pch":
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def prebuild(config: BenchConfig) -> dict[tuple[str, str], float]:
    """Build every extension the traces' programs need into the shared cache, two at a time, so
    that no mode pays a build another mode ran first (builds are cached per program source).
    Programs a fork model writes afresh (`model`) are built when they come, in every mode alike.
    Returns each built program's build seconds by (problem, program fingerprint): on a cold
    cache, what the program's first evaluation in a live run waits for (a failed build too)."""
    from concurrent.futures import ThreadPoolExecutor

    from specgen.errors import UsageError
    from specgen.eval.evaluator import EvalWorker
    from specgen.eval.loader import candidate_from_text
    from specgen.eval.options import EvalOptions
    from specgen.messages import CandidateSubmission
    from specgen.simulate.model import base_problem, program_key

    assert config.cache_dir is not None
    needing: list[tuple[tuple[str, str], CandidateSubmission]] = []
    for problem in config.problems:
        for source in set(programs_in(problem.trace)):
            try:
                if candidate_from_text(source).needs_build:
                    # With its problem: builds in __init__ and the first forward are made now too.
                    needing.append(((base_problem(problem.name), program_key(source)), CandidateSubmission(
                        job_id="prebuild", candidate_id="", problem_name=problem.problem,
                        problem_source=problem.source, candidate_source=source)))
            except UsageError:
                continue
    if not needing:
        return {}
    # On the first evaluation device: a GPU worker builds for its own architecture.
    worker = EvalWorker(config.devices[0], config.cache_dir.parent / "prebuild", spare_processes=0,
                        options=EvalOptions(**config.eval_options))
    worker.start()
    try:
        # Builds are compiler processes: one per core (at least 2), as many as there is work for.
        with ThreadPoolExecutor(max_workers=min(len(needing), max(2, os.cpu_count() or 2))) as pool:
            results = list(pool.map(lambda item: worker.build(item[1]), needing))
    finally:
        worker.close()
    return {key: round(result.seconds, 4) for (key, _), result in zip(needing, results)}


def describe(config: BenchConfig) -> dict[str, Any]:
    """The run's settings as results.json records them (both clocks)."""
    return {"modes": config.modes, "fork_model": config.fork_model,
            "fork_max_tokens": config.fork_max_tokens if FORK_MODELS[config.fork_model].needs_engine else None,
            "fork_engine": config.fork_engine if FORK_MODELS[config.fork_model].needs_engine else None,
            "timing": config.timing.to_dict(), "speed": config.speed,
            "concurrency": config.concurrency, "devices": config.devices,
            "prefix_cache": config.prefix_cache, "kv_pool": config.kv_pool,
            "time_budget_s": config.time_budget_s,
            "target_speedup": config.target_speedup,
            "improvement_margin": config.improvement_margin, "best_of_n": config.best_of_n,
            "drain_speculative": config.drain_speculative,
            "prebuilt": config.prebuild and config.cache_dir is not None,
            "eval_timeout_s": config.eval_options.get("timeout_s", _default_timeout_s()),
            "problems": [{"name": p.name, "problem": p.problem, "turns": len(p.trace.iterations),
                          "trace_model": p.trace.metadata.model,
                          "hand_written": p.trace.metadata.hand_written,
                          **({"trace": str(p.trace_path)} if p.trace_path is not None else {})}
                         for p in config.problems],
            "label": config.label}


def _default_timeout_s() -> float:
    from specgen.eval.options import EvalOptions

    return EvalOptions().timeout_s
