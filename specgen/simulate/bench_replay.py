"""`specgen simulate --replay-bench`: the configuration of a real `specgen bench` run (the same
generated traces, modes, worker count, concurrency, speed and timing model) simulated, and the
prediction set beside what the bench measured."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from specgen.errors import UsageError
from specgen.messages import TriggerSettings
from specgen.optimize.modes import MODES
from specgen.simulate.simulation import JobPlan, SimConfig, Simulation
from specgen.simulate.model import (
    ServiceTimes, TurnBank, base_problem, bench_seed, bench_timing, load_bench, trace_turn,
)


def _traces(data: dict[str, Any]):
    from specgen.optimize.bench_problems import generated_problems

    cfg = data["config"]
    seed = bench_seed(data)
    if seed is None or any(p.get("hand_written") is not False for p in cfg["problems"]):
        raise UsageError("--replay-bench replays generated traces only (bench --generate N)")
    names = [base_problem(p["name"]) for p in cfg["problems"]]
    turns = cfg["problems"][0]["turns"]
    gpu = any(str(d).startswith("cuda") for d in cfg["devices"])
    langs = ("torch", "triton", "cuda", "cpp") if gpu else ("torch", "cpp")
    return generated_problems(len(names), turns, seed, names, langs)


def replay(path: Path, seed: int = 0, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Predicted beside measured, per job and mode; `settings`: RuntimeSettings overrides (a what-if)."""
    data = load_bench(path)
    if data.get("clock") == "virtual":
        raise UsageError(f"{path}: a virtual-clock bench measured no job end to end, so there is "
                         "nothing to replay against; replay a `specgen bench --clock wall` run")
    cfg = data["config"]
    service = ServiceTimes.from_bench(path)
    problems = _traces(data)
    timing = bench_timing(data)
    measured = {(j["mode"], j["problem"]): j for j in data["jobs"]}
    bank = TurnBank([], 0, seed, TriggerSettings())
    rows, per_mode = [], {}
    concurrency = cfg["concurrency"]
    batches = [problems[i:i + concurrency] for i in range(0, len(problems), concurrency)]
    workers = len(cfg["devices"])
    for mode in cfg["modes"]:
        if mode not in MODES:
            continue
        forking = mode == "specgen"
        busy = avail = 0.0
        for index, batch in enumerate(batches):
            plans = []
            for k, p in enumerate(batch):
                turns = [[trace_turn(p.name, it, TriggerSettings(), forking, forking)]
                         * (cfg.get("best_of_n", 4) if mode == "best-of-n" else 1)
                         for it in p.trace.iterations]
                plans.append(JobPlan(job_id=f"{p.name}", problem=p.name, mode=mode, engine=k,
                                     turns=turns))
            # One modelled engine per job, as the bench gives each job its own.
            sim = Simulation(SimConfig(
                eval_gpus=workers, reasoning_engines=len(plans), elastic=mode == "specgen",
                hours=None, seed=seed, timing=timing, speed=cfg["speed"],
                turns=len(batch[0].trace.iterations), best_of_n=cfg.get("best_of_n", 4),
                target_speedup=cfg.get("target_speedup"), restart_jobs=False,
                settings=dict(settings or {})), service, bank, plans)
            r = sim.run()
            # As the bench measures it: the evaluations that reached a verdict (cancelled work is
            # not in its intervals).
            busy += r["completed_busy_s"]
            avail += workers * r["simulated_s"]
            for j in r["jobs"]:
                m = measured.get((mode, j["problem"]), {})
                rows.append({"mode": mode, "problem": j["problem"], "batch": index,
                             "predicted_end_to_end_s": j["end_to_end_s"],
                             "measured_end_to_end_s": m.get("end_to_end_s"),
                             "predicted_profiled": j["profiled"], "measured_profiled": m.get("profiled"),
                             "predicted_candidates": j["candidates"],
                             "measured_candidates": m.get("candidates"),
                             "predicted_unmeasured": j["unmeasured"]})
        per_mode[mode] = {"predicted_utilization": busy / avail if avail else None,
                          "measured_utilization": (data.get("utilization", {}).get(mode) or {}).get("of_run")}
    return {"bench": str(path), "hardware": data.get("hardware"), "rows": rows, "per_mode": per_mode,
            "service_times": service.summary()}


def table(result: dict[str, Any]) -> str:
    def f(x: Any) -> str:
        return "-" if x is None else (f"{x:.3g}" if isinstance(x, float) else str(x))

    def off(predicted: float | None, measured: float | None) -> float | None:
        return (predicted - measured) / measured if predicted is not None and measured else None

    lines = ["| mode | problem | end-to-end s predicted | measured | off | profiled predicted | measured | "
             "candidates predicted | measured | of them unmeasured |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    errors = []
    for r in result["rows"]:
        e = off(r["predicted_end_to_end_s"], r["measured_end_to_end_s"])
        errors += [e] if e is not None else []
        lines.append(f"| {r['mode']} | {r['problem']} | {f(r['predicted_end_to_end_s'])} | "
                     f"{f(r['measured_end_to_end_s'])} | {'-' if e is None else f'{e:+.1%}'} | "
                     f"{f(r['predicted_profiled'])} | {f(r['measured_profiled'])} | "
                     f"{f(r['predicted_candidates'])} | {f(r['measured_candidates'])} | "
                     f"{f(r.get('predicted_unmeasured'))} |")
    if errors:
        lines += ["", f"End to end: {sum(abs(e) <= 0.10 for e in errors)} of {len(errors)} jobs within 10% "
                      f"(from {min(errors):+.1%} to {max(errors):+.1%})."]
    lines += ["", "| mode | utilization predicted | measured (of run) | off |", "| --- | --- | --- | --- |"]
    for mode, u in result["per_mode"].items():
        e = off(u["predicted_utilization"], u["measured_utilization"])
        lines.append(f"| {mode} | {f(u['predicted_utilization'])} | {f(u['measured_utilization'])} | "
                     f"{'-' if e is None else f'{e:+.1%}'} |")
    return "\n".join(lines)
