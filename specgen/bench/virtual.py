"""`specgen bench --clock virtual` (the default): every mode at the regime users are in, in minutes.

Two steps, both on the bench's own problems (generated or imported traces):

1. **Measured**: every distinct program the traces can submit (each complete draft the loop's
   scanner finds in a turn's reasoning, each final answer; the `draft` and `named` fork models
   write nothing else) is evaluated for real, once per distinct evaluation device, one at a time
   there: validated, and profiled when correct. Its verdict, speedup and both stages' wall
   service times (the runner's start included) are what every mode then gets for it.
2. **Simulated**: each mode runs on a virtual clock through the simulator
   (`simulate/simulation.py`): the real `SchedulerCore` places the work, the loop's own triggers,
   load-aware gate and termination criterion decide, the timing model paces reasoning and forks at
   `--speed` (1 unless asked: the real regime), and the measured programs answer.

Nothing here is shaped by the mode: the programs, verdicts and service times are the same for all
of them. What the simulator does not model is said in the report: queueing of several workers on
one physical device (each worker is an independent server with the measured service times) and
a live engine's fork texts (`--fork-model model` needs `--clock wall`). `--clock wall` runs the
real loop on real time and stays the check of this one (`specgen simulate --replay-bench`).
"""
from __future__ import annotations

import json
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from specgen.bench.ceiling import ceiling, pooled
from specgen.bench.config import (BenchConfig, describe, forget_builds, hardware_label, prebuild,
                                  programs_in)
from specgen.bench.judged import count_not_judged, not_judged_lines, not_judged_reason
from specgen.bench.report import BASELINES, ceiling_lines, devices_text, geomean_ci, margin_text
from specgen.errors import UsageError
from specgen.messages import CandidateSubmission, TriggerSettings, Verdict
from specgen.optimize.bench_problems import BenchProblem
from specgen.traces.extraction import extract_candidate
from specgen.optimize.fork_models import replayable_fork_models
from specgen.optimize.termination import BeatsEarlier, JobStanding, VerdictView
from specgen.simulate.model import ServiceTimes, TurnBank, base_problem, program_key, trace_turn
from specgen.simulate.simulation import JobPlan, SimConfig, Simulation


def _programs(problems: list[BenchProblem]) -> list[tuple[BenchProblem, str, bool]]:
    """(problem, program, whether it is some turn's final answer), each program once per problem."""
    found: dict[tuple[str, str], tuple[BenchProblem, str, bool]] = {}
    for p in problems:
        finals = {extract_candidate(it.final.text, accept_unclosed=True) for it in p.trace.iterations}
        for source in programs_in(p.trace):
            key = (base_problem(p.name), program_key(source))
            if key not in found:
                found[key] = (p, source, source in finals)
    return list(found.values())


def _not_judged(verdict: Verdict) -> str:
    """"" when the verdict judged the program here (right, wrong or flagged; a build error on the
    GPU it is written for is wrong), else why not: the wall clock's rule (report.py,
    `not_judged_reason`), from the verdict's fields."""
    return not_judged_reason(bool(verdict.compiled), verdict.code, verdict.device)


# Rows measured before each row recorded why it was not judged (`--measured` of an older run)
# keep their `judged` as measured then, under this reason.
_UNRECORDED = "not judged (the measurement recorded no reason)"


def _row_reason(row: dict[str, Any]) -> str:
    return "" if row["judged"] else (row.get("not_judged") or _UNRECORDED)


def load_measured(path: Path, config: BenchConfig) -> list[dict[str, Any]]:
    """Rows of an earlier measurement: a virtual bench's results.json (its `evaluations`) or the
    measured.jsonl it writes as it goes (a run cut short keeps what it measured). Every program of
    this bench's traces must be among them, so that no mode is judged by a label."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"bench --measured {path}: {e.strerror or e}") from None
    try:
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("clock") != "virtual":
                raise UsageError(f"bench --measured {path}: not the results.json of a "
                                 "`specgen bench --clock virtual` run")
            rows = data.get("evaluations") or []
    except json.JSONDecodeError as e:
        raise UsageError(f"bench --measured {path}: not JSON ({e.msg}, line {e.lineno})") from None
    needed = {"problem", "program", "final", "judged", "correct"}
    for k, row in enumerate(rows):
        if not isinstance(row, dict) or not needed <= row.keys():
            raise UsageError(f"bench --measured {path}: evaluation {k} lacks "
                             f"{', '.join(sorted(needed - set(row)))}" if isinstance(row, dict)
                             else f"bench --measured {path}: evaluation {k} is not an object")
    have = {(r["problem"], r["program"]) for r in rows}
    missing = [(base_problem(p.name), program_key(source)) for p, source, _ in _programs(config.problems)
               if (base_problem(p.name), program_key(source)) not in have]
    if missing:
        raise UsageError(f"bench --measured {path}: {len(missing)} of this bench's programs were not "
                         f"measured there (first: {missing[0][0]} {missing[0][1]}); measure them "
                         "with the same traces (--generate/--turns/--seed or the same files)")
    return rows


def measure(config: BenchConfig, say=print) -> tuple[ServiceTimes, list[dict[str, Any]]]:
    """Step 1 (see the module doc): the service times and verdicts, and a row per evaluation,
    each row also appended to measured.jsonl beside the cache as it comes."""
    from specgen.eval.evaluator import EvalWorker
    from specgen.eval.options import EvalOptions

    assert config.cache_dir is not None
    options = {**config.eval_options, "cache_dir": str(config.cache_dir)}
    config.eval_options = options
    # Every build is made first, timed on a cold cache; the simulator adds a program's build to its
    # first evaluation in each mode's run (what a live run waits for), unless the builds were asked
    # for ahead of the run (`prebuild`: then no mode's times hold one).
    forget_builds(config)
    built = prebuild(config)
    programs = _programs(config.problems)
    devices = list(dict.fromkeys(config.devices))
    work = config.cache_dir.parent / "measured"
    log = config.cache_dir.parent / "measured.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    queue = list(programs)
    lock = threading.Lock()
    rows: list[dict[str, Any]] = []
    began = time.monotonic()

    def evaluate(device: str) -> None:
        hardware = hardware_label([device])
        worker = EvalWorker(device, work / device.replace(":", "-"), spare_processes=1,
                            options=EvalOptions(**options))
        with worker:
            while True:
                with lock:
                    if not queue:
                        return
                    problem, source, is_final = queue.pop(0)
                sub = CandidateSubmission(job_id="", candidate_id=f"m{len(rows):04d}",
                                          problem_name=problem.problem, problem_source=problem.source,
                                          candidate_source=source, origin="final" if is_final else "inline")
                row: dict[str, Any] = {"problem": base_problem(problem.name), "program": program_key(source),
                                       "final": is_final, "device": device, "hardware": hardware}
                if not config.prebuild and (row["problem"], row["program"]) in built:
                    row["build_s"] = built[(row["problem"], row["program"])]
                start = time.monotonic()
                validated = worker.run(sub, "validate")
                row["validate_s"] = time.monotonic() - start
                row["validate_stages"] = dict(validated.stage_seconds)
                row["not_judged"] = _not_judged(validated)
                row["judged"] = not row["not_judged"]
                row["compiled"], row["code"] = bool(validated.compiled), validated.code
                row["correct"] = bool(validated.correct)
                row["error"] = (validated.error or "; ".join(validated.flags))[:200]
                if validated.correct:
                    start = time.monotonic()
                    profiled = worker.run(sub, "profile")
                    row["profile_s"] = time.monotonic() - start
                    row["profile_stages"] = dict(profiled.stage_seconds)
                    row["correct"] = bool(profiled.correct)
                    row["speedup"] = profiled.speedup if profiled.correct else None
                    row["error"] = (profiled.error or "; ".join(profiled.flags))[:200]
                speed = "" if row.get("speedup") is None else f" {row['speedup']:.3f}x"
                with lock:
                    rows.append(row)
                    with log.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    say(f"  measured {len(rows)}/{len(programs)} on {device}: {row['problem']} "
                        f"{'answer' if is_final else 'draft'}, "
                        f"{'correct' if row['correct'] else 'not correct'}{speed} "
                        f"[{time.monotonic() - began:.0f} s]")

    with ThreadPoolExecutor(max_workers=len(devices)) as pool:
        list(pool.map(evaluate, devices))
    return ServiceTimes.from_measured(rows), rows


def _hardware(config: BenchConfig, rows: list[dict[str, Any]]) -> str:
    """Where the service times were measured (rows read with --measured came from elsewhere)."""
    where = sorted({r["hardware"] for r in rows if r.get("hardware")})
    return "measured on " + "; ".join(where) if where else hardware_label(config.devices)


def simulate(config: BenchConfig, service: ServiceTimes, seed: int = 0) -> dict[str, Any]:
    """Step 2 (see the module doc): per mode, the jobs of every batch and their feedback."""
    if config.fork_model not in replayable_fork_models():
        raise UsageError(f"bench --clock virtual: fork model {config.fork_model!r} writes from a live "
                         f"engine; use --clock wall (virtual: {', '.join(replayable_fork_models())})")
    bank = TurnBank([], 0, seed, TriggerSettings())
    turns = max(len(p.trace.iterations) for p in config.problems)
    batches = [config.problems[i:i + config.concurrency]
               for i in range(0, len(config.problems), config.concurrency)]
    out: dict[str, Any] = {}
    for mode in config.modes:
        forking = mode == "specgen"
        jobs, latencies, busy, avail = [], [], 0.0, 0.0
        for index, batch in enumerate(batches):
            plans = []
            for k, p in enumerate(batch):
                scripts = [trace_turn(p.name, it, TriggerSettings(), forking, forking,
                                      fork_model=config.fork_model)
                           for it in p.trace.iterations]
                plans.append(JobPlan(job_id=p.name, problem=p.name, mode=mode, engine=k,
                                     turns=[[s] * (config.best_of_n if mode == "best-of-n" else 1)
                                            for s in scripts]))
            sim = Simulation(SimConfig(
                eval_gpus=len(config.devices), reasoning_engines=len(plans), elastic=forking,
                hours=None, seed=seed, timing=config.timing, speed=config.speed, turns=turns,
                best_of_n=config.best_of_n, target_speedup=config.target_speedup,
                improvement_margin=config.improvement_margin,
                restart_jobs=False), service, bank, plans)
            result = sim.run()
            busy += result["completed_busy_s"]
            avail += len(config.devices) * result["simulated_s"]
            latencies += result["feedback_latencies"]
            jobs += [{**j, "batch": index} for j in result["jobs"]]
        answers = [s for j in jobs for s in j["answer_feedback_s"]]
        out[mode] = {"jobs": jobs, "feedback_p50_s": statistics.median(latencies) if latencies else None,
                     "answer_feedback_p50_s": statistics.median(answers) if answers else None,
                     "utilization": busy / avail if avail else None}
    return out


def named_saving_split(problems: list[BenchProblem], turns: list[Any],
                       rows: list[dict[str, Any]], margin: float | None) -> dict[str, float] | None:
    """Where the named ceiling's saving lies, as shares of it: turns whose final answer was not
    measured correct (`not_correct`), turns whose correct answer does not beat the job's earlier
    correct answers, or the reference before there is one, by the loop's improvement `margin`
    (`not_better`), and the rest (`better`). The ceiling stops every turn at the naming; the loop
    ends a turn early only on a correct kernel that beats the ones before it (termination.py,
    `BeatsEarlier`), so only `better` (and drafts that beat earlier kernels, which the ceiling does
    not count) is open to it (with no margin, nothing is). None when the ceiling saves nothing."""
    measured = {(r["problem"], r["program"]): r for r in rows}
    beats = BeatsEarlier(margin) if margin is not None else None
    by_turn = iter(turns)
    split = {"not_correct": 0, "not_better": 0, "better": 0}
    for problem in problems:
        bar = 1.0                                    # the reference, until a kernel is timed
        for index, it in enumerate(problem.trace.iterations):
            turn = next(by_turn)
            saving = turn.total_tokens - turn.named_stop_tokens
            final = extract_candidate(it.final.text, accept_unclosed=True)
            row = measured.get((base_problem(problem.name), program_key(final))) if final else None
            if row is None or not row["correct"]:
                split["not_correct"] += saving
                continue
            speedup = row.get("speedup") or 0.0
            stops = beats is not None and beats.check(VerdictView(problem.name, True, speedup),
                                                      JobStanding(index, bar, bar))
            split["better" if stops else "not_better"] += saving
            bar = max(bar, speedup)
    saved = sum(split.values())
    return {k: v / saved for k, v in split.items()} if saved else None


def summarize(config: BenchConfig, rows: list[dict[str, Any]], modes: dict[str, Any]) -> dict[str, Any]:
    """Per mode and the ratios (specgen against sequential, and against the best fair baseline:
    pipeline is none, since a replayed turn was written after its predecessor's verdict), next to
    both ceilings; no ratio when fewer than half of the answers could be judged here."""
    answers = [r for r in rows if r["final"]]
    judged = sum(r["judged"] for r in answers)
    # Per measured program (every mode ran on the same ones): drafts judged, and why the answers
    # and drafts not judged were not, as the wall clock's report counts them per mode.
    evidence: dict[str, Any] = {"not_judged": {}, "not_judged_examples": {}}
    for r in rows:
        why = _row_reason(r)
        if why:
            example = (r.get("error") or "").strip().splitlines()
            count_not_judged(evidence, f"{'answer' if r['final'] else 'draft'}: {why}",
                             example[0][:100] if example else "")
    drafts = [r for r in rows if not r["final"]]
    no_headline = None
    if not answers or 2 * judged < len(answers):
        no_headline = (f"only {judged} of {len(answers)} answers could be judged on this machine: "
                       "no ratio is printed")
    draft_bound, turns = ceiling([p.trace for p in config.problems])
    per_mode = {}
    for mode, m in modes.items():
        e2e = [j["end_to_end_s"] for j in m["jobs"]]
        best = [j["best_speedup"] for j in m["jobs"] if j["best_speedup"]]
        per_mode[mode] = {"end_to_end_s_geomean": geomean_ci(e2e)["geomean"],
                          "profiled": sum(j["profiled"] for j in m["jobs"]),
                          "best_speedup_geomean": geomean_ci(best)["geomean"],
                          "problems_with_a_correct_kernel": len(best), "jobs": len(m["jobs"]),
                          "feedback_p50_s": m["feedback_p50_s"],
                          "answer_feedback_p50_s": m.get("answer_feedback_p50_s"),
                          "utilization": m["utilization"],
                          "unmeasured": sum(j["unmeasured"] for j in m["jobs"])}
    ratios: dict[str, Any] = {}
    if "specgen" in modes and no_headline is None:
        by = {(mode, j["problem"]): j for mode, m in modes.items() for j in m["jobs"]}
        fair = [b for b in BASELINES if b in modes and b != "pipeline"]
        vs_seq, vs_best = [], []
        for (mode, problem), job in by.items():
            if mode != "specgen":
                continue
            theirs = {b: by[(b, problem)]["end_to_end_s"] for b in fair if (b, problem) in by}
            if theirs.get("sequential"):
                vs_seq.append(job["end_to_end_s"] / theirs["sequential"])
            if theirs:
                vs_best.append(job["end_to_end_s"] / min(theirs.values()))
        ratios = {"vs_sequential": geomean_ci(vs_seq), "vs_best_fair_baseline": geomean_ci(vs_best)}
        seq = per_mode.get("sequential")
        if seq and seq["profiled"]:
            ratios["profiled_vs_sequential"] = per_mode["specgen"]["profiled"] / seq["profiled"]
    return {"clock": "virtual", "config": describe(config),
            "speed": config.speed, "fork_model": config.fork_model,
            "devices": config.devices, "concurrency": config.concurrency,
            "improvement_margin": config.improvement_margin,
            "hardware": _hardware(config, rows),
            "ceiling": draft_bound, "named_ceiling": pooled(turns),
            "named_saving_split": named_saving_split(config.problems, turns, rows,
                                                     config.improvement_margin),
            "per_mode": per_mode,
            "ratios": ratios, "no_headline": no_headline,
            "answers": len(answers), "answers_judged": judged, "programs": len(rows),
            "drafts": len(drafts), "drafts_judged": sum(r["judged"] for r in drafts),
            "not_judged": evidence["not_judged"],
            "not_judged_examples": evidence["not_judged_examples"],
            "measured_s": sum(r.get("validate_s", 0.0) + r.get("profile_s", 0.0) for r in rows)}


def table(summary: dict[str, Any]) -> str:
    def fmt(x: Any, spec: str = ".2f") -> str:
        return "-" if x is None else format(x, spec)

    speed = summary["speed"]
    lines = [f"virtual clock: measured verdicts and service times of {summary['programs']} programs "
             f"(every draft and answer, once per device), every mode simulated on them; reasoning at "
             + ("the timing model's real pace" if speed == 1 else
                f"{speed:g}x the timing model's pace (a sensitivity, not the regime of a real run)")
             + f"; fork model {summary['fork_model']}; improvement margin "
             + margin_text(summary["improvement_margin"]),
             f"hardware: {summary['hardware']}; evaluation workers: {devices_text(summary['devices'])}, "
             "simulated as independent servers (workers sharing one device are not modelled as sharing it)",
             f"draft ceiling {summary['ceiling']:.3f}, named ceiling {summary['named_ceiling']:.3f} of "
             "sequential time", "",
             "| mode | end-to-end s (geo) | profiled | problems with a correct kernel | best speedup (geo) "
             "| feedback p50 s | answers' feedback p50 s | utilization |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for mode, m in summary["per_mode"].items():
        lines.append(f"| {mode} | {fmt(m['end_to_end_s_geomean'], '.1f')} | {m['profiled']} | "
                     f"{m['problems_with_a_correct_kernel']} of {m['jobs']} | "
                     f"{fmt(m['best_speedup_geomean'], '.3f')} | {fmt(m['feedback_p50_s'])} | "
                     f"{fmt(m.get('answer_feedback_p50_s'))} | {fmt(m['utilization'], '.0%')} |")
    lines += ["", f"answers judged here: {summary['answers_judged']} of {summary['answers']}; drafts "
                  f"judged here (programs only the reasoning wrote): {summary.get('drafts_judged', 0)} "
                  f"of {summary.get('drafts', 0)}"]
    lines += not_judged_lines(summary, "measured programs, every mode alike")
    if summary["no_headline"]:
        lines.append(summary["no_headline"])
        return "\n".join(lines)
    r = summary["ratios"]
    for key, label in (("vs_sequential", "sequential"), ("vs_best_fair_baseline", "best fair baseline "
                                                                 "(sequential or best-of-n; pipeline is none on replayed turns)")):
        g = r.get(key)
        if g and g["geomean"] is not None:
            lines.append(f"specgen / {label}, end-to-end: {g['geomean']:.3f} (95% CI {g['low']:.3f}-"
                         f"{g['high']:.3f} over {g['n']} problems, one run)")
    lines += ceiling_lines((r.get("vs_sequential") or {}).get("geomean"), summary["ceiling"],
                           summary["named_ceiling"])
    split = summary.get("named_saving_split")
    if split:
        lines.append(f"of the named ceiling's saving, {split['not_correct']:.0%} lies in turns whose final "
                     f"answer was not correct here and {split['not_better']:.0%} in turns whose correct "
                     "answer does not beat the job's earlier answers (or the reference) by the loop's "
                     "margin: the ceiling stops those too, the loop ends a turn early only on a correct "
                     f"kernel that beats the ones before it ({split['better']:.0%} lies elsewhere)")
    if r.get("profiled_vs_sequential") is not None:
        lines.append(f"profiling feedback, specgen / sequential: {r['profiled_vs_sequential']:.2f}x")
    return "\n".join(lines)


def run_virtual(config: BenchConfig, seed: int, say=print,
                measured: Path | None = None) -> dict[str, Any]:
    """Both steps (step 1 read from `measured` when given); the summary, with the measured rows
    and every simulated job."""
    began = time.monotonic()
    if measured is not None:
        rows = load_measured(measured, config)
        service = ServiceTimes.from_measured(rows, source=str(measured))
        say(f"  {len(rows)} programs' verdicts and service times read from {measured}")
    else:
        service, rows = measure(config, say)
    measured_wall = time.monotonic() - began
    modes = simulate(config, service, seed)
    summary = summarize(config, rows, modes)
    summary["measured_wall_s"] = measured_wall
    if measured is not None:
        summary["measured_from"] = str(measured)
    summary["evaluations"] = rows
    summary["jobs"] = [{"mode": mode, **j} for mode, m in modes.items() for j in m["jobs"]]
    if any(m["unmeasured"] for m in summary["per_mode"].values()):
        # A program the traces hold that was not measured would be judged by its label: say so.
        summary["note"] = "some simulated candidates were not among the measured programs"
    return summary
