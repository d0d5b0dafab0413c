"""`specgen bench --clock wall`: problems x modes side by side in one run, on real time, every
candidate evaluated for real as the loop submits it.

Every mode replays the same traces (`optimize/bench_problems.py`) through a `ModelledEngine` (the timing
model paces every token; forks come from the fork model), and evaluates its candidates on a local
cluster (GPUs when present, else CPU workers; the report says which). Problems run in batches of
`concurrency` jobs at once; within a batch every mode runs in turn, the order rotating from batch
to batch so that no mode always meets the machine in the same state, each on a cluster of its own
with its own pool policy (elastic for specgen, static for the baselines), over the same devices.

Per mode and problem it records: end-to-end time, the time to the first kernel within 5% of the
run's best for that problem (the best over all modes), profiling feedback, best speedup, tokens,
feedback latency, and the workers' busy intervals (from their own start and finish times). The
report (`report.py`) turns them into ratios, confidence intervals, plots and a table.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import platform
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from specgen.bench.ceiling import ceiling, pooled
from specgen.engines.timing_model import TimingModel
from specgen.engines.trace import Trace
from specgen.messages import OptimizeResult, OptimizeSpec
from specgen.optimize.bench_problems import BenchProblem
from specgen.optimize.fork_models import FORK_MODELS, fork_writer
from specgen.optimize.modes import MODES
from specgen.optimize.trace_replay import IterationModelledEngine

NEAR_BEST = 0.95            # "the first kernel within 5% of the run's best"


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
    best_of_n: int = 4
    drain_speculative: bool = False          # the jobs wait for speculative verdicts at their end
    eval_options: dict[str, Any] = field(default_factory=dict)
    runtime_settings: list[str] = field(default_factory=list)
    live_engine: Any = None                  # for fork model "model"
    fork_max_tokens: int = 2048              # a live engine's fork length cap (fork model "model")
    label: str = ""
    cache_dir: Path | None = None            # evaluation cache shared by every mode's cluster
    prebuild: bool = True                    # build the traces' extensions before the timed run

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
        # Results are kept per (mode, name): a second entry of one name would hide the first.
        names = [p.name for p in self.problems]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise UsageError(f"bench: problem name(s) {', '.join(repeated)} given more than once "
                             "(traces and --generate of one problem?); bench them separately")


@dataclass
class BenchJobRecord:
    mode: str
    problem: str
    batch: int
    result: OptimizeResult
    intervals: list[tuple[str, float, float]]   # (worker, start, end), wall clock
    forks_written: int = 0
    # Each stage evaluation with its stage and verdict timings: the service times a simulation
    # (specgen simulate --from-bench) draws from; intervals alone do not say which stage ran.
    evaluations: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class BatchRecord:
    batch: int
    mode: str
    started_at: float
    finished_at: float
    workers: int
    # The scheduler's own measure: busy worker share over the time a request sat in a queue,
    # and that time (SchedulerStats.busy_while_waiting, waiting_s).
    busy_while_queued: float | None = None
    queued_s: float = 0.0


@dataclass
class BenchRun:
    config: dict[str, Any]
    jobs: list[BenchJobRecord] = field(default_factory=list)
    batches: list[BatchRecord] = field(default_factory=list)
    ceiling: float = 1.0                    # the draft ceiling (ceiling.py), pooled
    named_ceiling: float = 1.0              # the named ceiling, pooled
    ceiling_turns: list[dict] = field(default_factory=list)
    hardware: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0


def _intervals(result: OptimizeResult) -> list[tuple[str, float, float]]:
    found = []
    for record in result.candidates:
        for update in (record.validation, record.profile):
            if update is not None and not update.cancelled and update.finished_at > update.started_at > 0:
                found.append((update.worker or "?", update.started_at, update.finished_at))
    # A single "full" update is stored as both validation and profile: count it once.
    return sorted(set(found), key=lambda item: item[1])


def _evaluations(result: OptimizeResult) -> list[dict[str, Any]]:
    found = []
    for c in result.candidates:
        updates = [u for u in (c.validation, c.profile) if u is not None]
        if len(updates) == 2 and updates[0] is updates[1]:
            updates = updates[:1]
        for u in updates:
            if u.cancelled or not u.finished_at > u.started_at > 0:
                continue
            found.append({"candidate": c.candidate_id, "program": c.fingerprint, "origin": c.origin,
                          "iteration": c.iteration,
                          "position": c.position, "extracted_at": c.extracted_at,
                          "stage": u.stage, "worker": u.worker, "started_at": u.started_at,
                          "finished_at": u.finished_at, "compiled": u.verdict.compiled,
                          "correct": u.verdict.correct, "speedup": u.verdict.speedup,
                          "stage_seconds": dict(u.verdict.stage_seconds)})
    return found


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


async def _one_job(config: BenchConfig, problem: BenchProblem, mode: str, backend: Any,
                   batch: int) -> BenchJobRecord:
    from specgen.optimize.loop import run_job

    writer = (fork_writer(config.fork_model, config.live_engine, max_tokens=config.fork_max_tokens)
              if FORK_MODELS[config.fork_model].needs_engine else fork_writer(config.fork_model))
    engine = IterationModelledEngine(problem.trace, writer, timing=config.timing,
                                     speed=config.speed, prefix_cache=config.prefix_cache,
                                     kv_pool=config.kv_pool)
    spec = OptimizeSpec(
        job_id=f"bench-{config.label or 'run'}-{batch}-{problem.name}-{mode}",
        problem_name=problem.problem, problem_source=problem.source, mode=mode,
        max_iterations=len(problem.trace.iterations), time_budget_s=config.time_budget_s,
        target_speedup=config.target_speedup, best_of_n=config.best_of_n,
        drain_speculative=config.drain_speculative)
    result = await run_job(spec, engine, backend)
    return BenchJobRecord(mode=mode, problem=problem.name, batch=batch, result=result,
                     intervals=_intervals(result), forks_written=engine.forks_written,
                     evaluations=_evaluations(result))


@contextlib.asynccontextmanager
async def _local_cluster(devices: list[str], *, elastic: bool, eval_options: dict[str, Any],
                         runtime_settings: list[str] = ()) -> AsyncIterator[Any]:
    """A scheduler and a node over `devices` on this machine for one mode's batch, their journal in
    a temporary folder gone after; `cluster.backend()` gives each job a backend of its own."""
    from specgen.runtime.local import LocalCluster
    from specgen.runtime.settings import RuntimeSettings

    settings = RuntimeSettings(pool_mode="elastic" if elastic else "static",
                               eval_options=dict(eval_options))
    settings = settings.with_overrides(list(runtime_settings))
    cluster = LocalCluster(devices=devices, settings=settings, kv_control=False, state_dir=None,
                           supervise=True)
    await asyncio.to_thread(cluster.start)
    try:
        yield cluster
    finally:
        await asyncio.to_thread(cluster.stop)


async def run_bench(config: BenchConfig,
                    on_job_done: Callable[[BenchJobRecord], None] | None = None) -> BenchRun:
    config.check()
    if config.cache_dir is not None:
        config.eval_options = {**config.eval_options, "cache_dir": str(config.cache_dir)}
        if config.prebuild:
            await asyncio.to_thread(prebuild, config)
    draft_bound, turns = ceiling([p.trace for p in config.problems])
    # Per turn under the entry's name: several traces of one problem are told apart.
    entries = [p.name for p in config.problems for _ in p.trace.iterations]
    run = BenchRun(config=describe(config), ceiling=draft_bound, named_ceiling=pooled(turns),
                   ceiling_turns=[{**dataclasses.asdict(t), "problem": name}
                                  for t, name in zip(turns, entries)],
                   hardware=hardware_label(config.devices), started_at=time.time())
    batches = [config.problems[i:i + config.concurrency]
               for i in range(0, len(config.problems), config.concurrency)]
    for index, batch in enumerate(batches):
        shift = index % len(config.modes)
        for mode in config.modes[shift:] + config.modes[:shift]:
            async with _local_cluster(config.devices, elastic=mode == "specgen",
                                      eval_options=config.eval_options,
                                      runtime_settings=config.runtime_settings) as cluster:
                began = time.time()
                # One backend per job: each reads only its own job's updates.
                jobs = await asyncio.gather(*(_one_job(config, p, mode, cluster.backend(), index)
                                              for p in batch))
                finished = time.time()
                stats = await asyncio.to_thread(cluster.client.stats)
                run.batches.append(BatchRecord(index, mode, began, finished, len(config.devices),
                                               stats.busy_while_waiting, stats.waiting_s))
            for job in jobs:
                run.jobs.append(job)
                if on_job_done is not None:
                    on_job_done(job)
    run.finished_at = time.time()
    return run


def programs_in(trace: Trace) -> list[str]:
    """Every complete ModelNew program a trace's reasoning drafts (fenced or not, as the loop's
    inline-candidate trigger finds them) or its answers give."""
    from specgen.optimize.extraction import extract_candidate, find_drafts

    found: dict[str, None] = {}
    for iteration in trace.iterations:
        # ended: the loop also harvests what the end of the reasoning completes.
        for block in find_drafts(iteration.reasoning.text, ended=True):
            found[block.source] = None
        final = extract_candidate(iteration.final.text, accept_unclosed=True)
        if final:
            found[final] = None
    return list(found)


def prebuild(config: BenchConfig) -> int:
    """Build every extension the traces' programs need into the shared cache, two at a time, so
    that no mode pays a build another mode ran first (builds are cached per program source).
    Programs a fork model writes afresh (`model`) are built when they come, in every mode alike."""
    from concurrent.futures import ThreadPoolExecutor

    from specgen.errors import UsageError
    from specgen.eval.evaluator import EvalWorker
    from specgen.eval.loader import candidate_from_text
    from specgen.eval.options import EvalOptions

    assert config.cache_dir is not None
    sources = {s for p in config.problems for s in programs_in(p.trace)}
    needing = []
    for source in sources:
        try:
            if candidate_from_text(source).needs_build:
                needing.append(source)
        except UsageError:
            continue
    if not needing:
        return 0
    # On the first evaluation device: a GPU worker builds for its own architecture.
    worker = EvalWorker(config.devices[0], config.cache_dir.parent / "prebuild", spare_processes=0,
                        options=EvalOptions(**config.eval_options))
    worker.start()
    try:
        # Builds are compiler processes: one per core (at least 2), as many as there is work for.
        with ThreadPoolExecutor(max_workers=min(len(needing), max(2, os.cpu_count() or 2))) as pool:
            list(pool.map(worker.build, needing))
    finally:
        worker.close()
    return len(needing)


def describe(config: BenchConfig) -> dict[str, Any]:
    """The run's settings as results.json records them (both clocks)."""
    return {"modes": config.modes, "fork_model": config.fork_model,
            "fork_max_tokens": config.fork_max_tokens if FORK_MODELS[config.fork_model].needs_engine else None,
            "timing": config.timing.to_dict(), "speed": config.speed,
            "concurrency": config.concurrency, "devices": config.devices,
            "prefix_cache": config.prefix_cache, "kv_pool": config.kv_pool,
            "time_budget_s": config.time_budget_s,
            "target_speedup": config.target_speedup, "best_of_n": config.best_of_n,
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
