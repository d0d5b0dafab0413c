"""`specgen bench --clock wall`: problems x modes side by side in one run, on real time, every
candidate evaluated for real as the loop submits it.

Every mode replays the same traces (`optimize/bench_problems.py`) through a `ModelledEngine` (the
timing model paces every token; forks come from the fork model), and evaluates its candidates on a
local cluster (GPUs when present, else CPU workers; the report says which). Problems run in batches
of `concurrency` jobs at once; within a batch every mode runs in turn, the order rotating from batch
to batch so that no mode always meets the machine in the same state, each on a cluster of its own
with its own pool policy (elastic for specgen, static for the baselines), over the same devices.

Per mode and problem it records: end-to-end time, the time to the first kernel within 5% of the
run's best for that problem (the best over all modes), profiling feedback, best speedup, tokens,
feedback latency, and the workers' busy intervals (from their own start and finish times). The
report (`report.py`) turns them into ratios, confidence intervals, plots and a table.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from specgen.bench.ceiling import ceiling, pooled
from specgen.bench.config import BenchConfig, describe, forget_builds, hardware_label, prebuild
from specgen.messages import OptimizeResult, OptimizeSpec
from specgen.optimize import prompts
from specgen.optimize.bench_problems import BenchProblem
from specgen.optimize.fork_models import FORK_MODELS, fork_writer
from specgen.traces.pinned_replay import IterationModelledEngine

NEAR_BEST = 0.95            # "the first kernel within 5% of the run's best"


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


async def _one_job(config: BenchConfig, problem: BenchProblem, mode: str, backend: Any,
                   batch: int) -> BenchJobRecord:
    from specgen.optimize.loop import run_job

    if FORK_MODELS[config.fork_model].needs_engine:
        # The first iteration's prompt of a live job on this problem, for turns that recorded none.
        writer = fork_writer(config.fork_model, config.live_engine, max_tokens=config.fork_max_tokens,
                             messages=prompts.chat(problem.source, [], None))
    else:
        writer = fork_writer(config.fork_model)
    engine = IterationModelledEngine(problem.trace, writer, timing=config.timing,
                                     speed=config.speed, prefix_cache=config.prefix_cache,
                                     kv_pool=config.kv_pool)
    spec = OptimizeSpec(
        job_id=f"bench-{config.label or 'run'}-{batch}-{problem.name}-{mode}",
        problem_name=problem.problem, problem_source=problem.source, mode=mode,
        max_iterations=len(problem.trace.iterations), time_budget_s=config.time_budget_s,
        target_speedup=config.target_speedup, improvement_margin=config.improvement_margin,
        best_of_n=config.best_of_n,
        drain_speculative=config.drain_speculative)
    result = await run_job(spec, engine, backend)
    return BenchJobRecord(mode=mode, problem=problem.name, batch=batch, result=result,
                     intervals=_intervals(result), forks_written=engine.forks_written,
                     evaluations=_evaluations(result))


async def run_bench(config: BenchConfig,
                    on_job_done: Callable[[BenchJobRecord], None] | None = None) -> BenchRun:
    from specgen.runtime.connect import cluster_settings, connect

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
            if not config.prebuild:
                # Each mode's batch waits for its own builds, as a live run does; none inherits
                # what the mode before it built.
                await asyncio.to_thread(forget_builds, config)
            # One local cluster per mode's batch, its journal in a temporary folder gone after.
            settings = cluster_settings(mode == "specgen", config.eval_options, config.runtime_settings)
            async with connect("local", devices=config.devices, settings=settings) as cluster:
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
