"""What `specgen bench` reports: per-problem and per-mode figures, ratios with bootstrap confidence
intervals, true utilization, the results JSON and the plots.

Ratios compare specgen with the best *fair* baseline of each problem (the one with the lowest time)
and, apart, with sequential: per problem specgen's time over it, then the geometric mean over
problems, with a 95% bootstrap interval over problems (numpy, seeded) of this one run, not over
repeated runs. A mode that never reached a kernel within 5% of the run's best counts its whole
end-to-end time there. Pipeline is a fair baseline for a problem only if it began no turn before the
previous turn's verdict: a replayed trace's next turn was written after that verdict, so replay
hands pipeline for free what a live run would have to wait for.

No ratio is reported when fewer than half of the answers (the reasoning's final kernels, over all
modes) could be judged on this machine. A candidate is judged when its verdict says right or wrong;
a build or load failure on the host that should run it is wrong, like any compile error (both
clocks decide it with `judged.not_judged_reason`, from the verdict's fields). Every answer and speculative
candidate not judged is counted by reason, in both clocks' reports.

True utilization is worker-seconds spent on evaluation (the union of each worker's own busy
intervals: building, validating, profiling) over worker-seconds available, over a batch's span
("of the run") and over the span in which evaluation work existed, from the first candidate's
extraction to the last verdict ("while work waits").
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from specgen.bench.ceiling import share_of_saving
from specgen.bench.judged import evidence, not_judged_lines, pooled_evidence
from specgen.bench.wall import NEAR_BEST, BenchJobRecord, BenchRun
from specgen.runtime.private_files import make_private_dir, open_private, write_private

BASELINES = ("sequential", "best-of-n", "pipeline")
# Below this share of answers judged on this machine the run is no evidence of a ratio.
MIN_JUDGED_SHARE = 0.5


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def _turns_without_verdict(job: BenchJobRecord) -> int:
    """Iterations that began before the previous iteration's answer had its verdict: what a
    replayed trace gives pipeline for free (the recording's next turn was written after it)."""
    r = job.result
    answered: dict[int, float | None] = {}
    for c in r.candidates:
        if c.origin == "final" and c.duplicate_of is None:
            answered[c.iteration] = c.feedback_at
    return sum(1 for it in r.iterations if it.index > 0 and it.index - 1 in answered
               and (answered[it.index - 1] is None or answered[it.index - 1] > it.started_at))


def job_figures(job: BenchJobRecord, run_best: float | None) -> dict[str, Any]:
    r, m = job.result, job.result.metrics
    to_near_best = None
    if run_best is not None:
        hits = [c.feedback_at for c in r.candidates
                if c.speedup is not None and c.feedback_at and c.speedup >= NEAR_BEST * run_best]
        if hits:
            to_near_best = min(hits) - r.started_at
    extracted = [c.extracted_at for c in r.candidates if c.extracted_at]
    answered = [c.feedback_at for c in r.candidates if c.feedback_at]
    return {
        "mode": job.mode, "problem": job.problem, "batch": job.batch, "status": r.status,
        "end_to_end_s": m.end_to_end_s, "to_near_best_s": to_near_best,
        "profiled": m.profiled, "validated": m.validated, "candidates": m.candidates,
        "forks": m.forks, "best_speedup": r.best_speedup, "tokens": m.total_tokens,
        "reasoning_tokens": m.reasoning_tokens, "fork_tokens": m.fork_tokens,
        "feedback_p50_s": m.feedback_p50_s, "feedback_p95_s": m.feedback_p95_s,
        "busy_s": _union([(s, e) for _, s, e in job.intervals]),
        "work_span": [min(extracted), max(answered)] if extracted and answered else None,
        "forks_written": job.forks_written,
        "turns_without_verdict": _turns_without_verdict(job),
        **evidence(r.candidates),
    }


def geomean_ci(values: list[float], seed: int = 0, rounds: int = 2000) -> dict[str, float | None]:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    if not values:
        return {"geomean": None, "low": None, "high": None, "n": 0}
    logs = np.log(np.array(values))
    rng = np.random.default_rng(seed)
    samples = rng.choice(logs, size=(rounds, len(logs)), replace=True).mean(axis=1)
    return {"geomean": float(np.exp(logs.mean())), "low": float(np.exp(np.percentile(samples, 2.5))),
            "high": float(np.exp(np.percentile(samples, 97.5))), "n": len(values)}


def over_repeats(rows: list[dict[str, Any]], what: str) -> str:
    """The end-to-end ratios of repeated runs, and a 95% t-interval of their geometric mean over
    the repeats: the run-to-run spread, which the per-run interval over problems is not."""
    from scipy import stats

    lines = [f"| repeat ({what}) | specgen / best fair baseline (geo) | 95% CI over problems "
             "| specgen / sequential (geo) |", "| --- | --- | --- | --- |"]

    def fmt(x: Any) -> str:
        return "-" if x is None else f"{x:.3f}"

    for row in rows:
        lines.append(f"| {row['variant']} | {fmt(row['ratio'])} | {fmt(row['low'])}-{fmt(row['high'])} "
                     f"| {fmt(row.get('vs_sequential'))} |")
    lines.append("")
    for key, label in (("ratio", "best fair baseline"), ("vs_sequential", "sequential")):
        logs = np.log([r[key] for r in rows if r.get(key)])
        if len(logs) < 2:
            lines.append(f"specgen / {label} over repeats: fewer than 2 repeats with a ratio")
            continue
        half = stats.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs))
        lines.append(f"specgen / {label}, end-to-end, over {len(logs)} repeats ({what}): "
                     f"{math.exp(logs.mean()):.3f} (95% CI {math.exp(logs.mean() - half):.3f}-"
                     f"{math.exp(logs.mean() + half):.3f}, t over repeats)")
    return "\n".join(lines)


def utilization(run: BenchRun) -> dict[str, dict[str, float | None]]:
    """Per mode: busy worker-seconds over available, over the batches' spans and over the spans
    in which evaluation work existed."""
    out: dict[str, dict[str, float | None]] = {}
    for mode in run.config["modes"]:
        busy = avail = busy_w = avail_w = busy_q = queued = 0.0
        for batch in [b for b in run.batches if b.mode == mode]:
            if batch.busy_while_queued is not None:
                busy_q += batch.busy_while_queued * batch.queued_s
                queued += batch.queued_s
            jobs = [j for j in run.jobs if j.mode == mode and j.batch == batch.batch]
            per_worker: dict[str, list[tuple[float, float]]] = {}
            for job in jobs:
                for worker, start, end in job.intervals:
                    per_worker.setdefault(worker, []).append((start, end))
            spent = sum(_union(v) for v in per_worker.values())
            busy += spent
            avail += batch.workers * (batch.finished_at - batch.started_at)
            starts = [min(c.extracted_at for c in j.result.candidates if c.extracted_at)
                      for j in jobs if any(c.extracted_at for c in j.result.candidates)]
            ends = [max(c.feedback_at for c in j.result.candidates if c.feedback_at)
                    for j in jobs if any(c.feedback_at for c in j.result.candidates)]
            if starts and ends and max(ends) > min(starts):
                lo, hi = min(starts), max(ends)
                busy_w += sum(_union([(max(s, lo), min(e, hi)) for s, e in v if e > lo and s < hi])
                              for v in per_worker.values())
                avail_w += batch.workers * (hi - lo)
        out[mode] = {"of_run": busy / avail if avail else None,
                     "while_work_waits": busy_w / avail_w if avail_w else None,
                     # the scheduler's measure: only the time a request sat in a queue
                     "while_queued": busy_q / queued if queued else None,
                     "queued_s": queued}
    return out


def summarize(run: BenchRun) -> dict[str, Any]:
    modes = run.config["modes"]
    best_of: dict[str, float | None] = {}
    for job in run.jobs:
        s = job.result.best_speedup
        if s is not None and (best_of.get(job.problem) is None or s > best_of[job.problem]):
            best_of[job.problem] = s
    figures = [job_figures(j, best_of.get(j.problem)) for j in run.jobs]
    by = {(f["mode"], f["problem"]): f for f in figures}
    problems = sorted({f["problem"] for f in figures})
    per_mode = {}
    for mode in modes:
        rows = [by[(mode, p)] for p in problems if (mode, p) in by]
        fb = [x for r in rows for x in [r["feedback_p50_s"]] if x is not None]
        per_mode[mode] = {
            "end_to_end_s": geomean_ci([r["end_to_end_s"] for r in rows]),
            "to_near_best_s": geomean_ci([r["to_near_best_s"] or r["end_to_end_s"] for r in rows]),
            "profiled_total": sum(r["profiled"] for r in rows),
            "best_speedup": geomean_ci([r["best_speedup"] for r in rows if r["best_speedup"]]),
            "tokens_total": sum(r["tokens"] for r in rows),
            "feedback_p50_s_median": float(np.median(fb)) if fb else None,
            "problems_with_correct_kernel": sum(1 for r in rows if r["best_speedup"]),
            **pooled_evidence(rows),
        }
    evidence = pooled_evidence(figures)
    judged_share = (evidence["answers_judged"] / evidence["answers"]) if evidence["answers"] else 0.0
    no_headline = None
    if judged_share < MIN_JUDGED_SHARE:
        no_headline = (f"only {evidence['answers_judged']} of {evidence['answers']} answers could "
                       "be judged on this machine: no ratio is printed")
    ratios: dict[str, Any] = {}
    baselines = [m for m in modes if m in BASELINES]
    if "specgen" in modes and baselines and no_headline is None:
        def fair(mode: str, problem: str) -> bool:
            # Pipeline starts a turn without its predecessor's verdict; replaying a trace whose
            # next turn was written after that verdict costs it nothing, so it is a baseline only
            # where it ran no turn that way.
            return (mode, problem) in by and (
                mode != "pipeline" or by[(mode, problem)]["turns_without_verdict"] == 0)

        for key in ("end_to_end_s", "to_near_best_s"):
            per_problem, per_sequential, against = {}, {}, {}
            for p in problems:
                if ("specgen", p) not in by:
                    continue
                ours = by[("specgen", p)][key] or by[("specgen", p)]["end_to_end_s"]
                theirs = {b: by[(b, p)][key] or by[(b, p)]["end_to_end_s"]
                          for b in baselines if fair(b, p)}
                theirs = {b: t for b, t in theirs.items() if t}
                if theirs and ours:
                    best = min(theirs, key=theirs.__getitem__)
                    per_problem[p], against[p] = ours / theirs[best], best
                if ours and theirs.get("sequential"):
                    per_sequential[p] = ours / theirs["sequential"]
            ratios[key] = {"per_problem": per_problem, "baseline_per_problem": against,
                           **geomean_ci(list(per_problem.values()))}
            ratios[f"{key}_vs_sequential"] = {"per_problem": per_sequential,
                                              **geomean_ci(list(per_sequential.values()))}
        unfair = sorted(p for p in problems if ("pipeline", p) in by and not fair("pipeline", p))
        ratios["pipeline_not_a_baseline"] = {
            p: by[("pipeline", p)]["turns_without_verdict"] for p in unfair}
        seq = {p: by[("sequential", p)]["profiled"] for p in problems if ("sequential", p) in by}
        ours = {p: by[("specgen", p)]["profiled"] for p in problems if ("specgen", p) in by}
        ratios["profiled_vs_sequential"] = (sum(ours.values()) / sum(seq.values())
                                            if seq and sum(seq.values()) else None)
        best_base = max((per_mode[b]["best_speedup"]["geomean"] or 0.0) for b in baselines)
        ratios["best_speedup_vs_best_baseline"] = ((per_mode["specgen"]["best_speedup"]["geomean"] or 0.0)
                                                   / best_base if best_base else None)
    return {"hardware": run.hardware, "config": run.config, "ceiling": run.ceiling,
            "named_ceiling": run.named_ceiling,
            "per_mode": per_mode, "ratios": ratios, "evidence": evidence,
            "no_headline": no_headline, "utilization": utilization(run),
            "jobs": figures, "wall_s": run.finished_at - run.started_at}


def write_results(run: BenchRun, summary: dict[str, Any], out: Path) -> Path:
    make_private_dir(out)
    data = {**summary, "ceiling_turns": run.ceiling_turns,
            "batches": [asdict(b) for b in run.batches],
            "intervals": [{"mode": j.mode, "problem": j.problem, "batch": j.batch,
                           "intervals": j.intervals, "evaluations": j.evaluations,
                           "started_at": j.result.started_at, "finished_at": j.result.finished_at}
                          for j in run.jobs]}
    path = out / "results.json"
    write_private(path, json.dumps(data, indent=2, default=str))
    return path


# The smallest saving of a ceiling (a share of sequential time) a share of it is printed against.
# A share divides the measured saving by the ceiling's: below 2% of sequential time, a wobble of
# 1% in the measured ratio (less than one run's interval over problems) moves the share by half
# of the ceiling's saving or more, and a ceiling of 0.998 turns a 1% saving into "500%". Below it
# both savings are printed as they are, and no share.
MIN_CEILING_SAVING = 0.02


def _pct(x: float) -> str:
    return f"{x:.1%}"


def saving_against_ceiling(measured: float, bound: float) -> str:
    """What specgen saved against sequential beside what a ceiling saves, both as shares of
    sequential time (the unit of both: the ratio is a geometric mean over problems, the ceiling
    pooled over tokens, so seconds of either would be no job's), and the share of the ceiling's
    saving achieved only where it means something: the ceiling saves at least
    MIN_CEILING_SAVING and specgen saved between nothing and all of it. Otherwise the line says
    which case it is instead of printing a share below 0% or above 100%."""
    saved, ceiling_saves = 1.0 - measured, 1.0 - bound
    if ceiling_saves <= 0:
        ceiling_text = "the ceiling saves nothing"
    else:
        ceiling_text = f"the ceiling saves {_pct(ceiling_saves)}"
    if saved <= 0:
        slower = "" if saved == 0 else f" (it took {_pct(-saved)} longer)"
        return f"specgen saved nothing against sequential{slower}; {ceiling_text}: no share of it"
    if ceiling_saves <= 0:
        return f"specgen saved {_pct(saved)} of sequential time; {ceiling_text}: no share of it"
    if ceiling_saves < MIN_CEILING_SAVING:
        return (f"specgen saved {_pct(saved)} of sequential time; {ceiling_text}, too little for a "
                "share of it to mean anything")
    if saved > ceiling_saves:
        return (f"specgen saved {_pct(saved)} of sequential time, more than this ceiling's "
                f"{_pct(ceiling_saves)} (a ceiling counts only the reasoning it stops, not verdicts "
                "that came sooner or other stops): no share of it")
    share = share_of_saving(measured, bound)
    return (f"specgen saved {_pct(saved)} of sequential time, {ceiling_text}: "
            f"{share:.0%} of its saving achieved")


def ceiling_lines(measured: float | None, draft: float, named: float) -> list[str]:
    """specgen / sequential end to end next to each ceiling, with what each saves and the share of
    its saving achieved where that is meaningful (nothing without a measured ratio)."""
    if measured is None:
        return []
    return [f"specgen / sequential end to end {measured:.3f} against the {label} {bound:.3f}: "
            + saving_against_ceiling(measured, bound)
            for bound, label in ((draft, "draft ceiling"), (named, "named ceiling"))]


def devices_text(devices: list[str]) -> str:
    """Workers as they were: "8 on cuda:0" when eight share one GPU, not "8 GPUs"."""
    counts: dict[str, int] = {}
    for device in devices:
        counts[device] = counts.get(device, 0) + 1
    return ", ".join(f"{n} on {d}" for d, n in counts.items()) or "-"


def margin_text(margin: float | None) -> str:
    """The loop's improvement margin as run: a kernel beating the earlier ones by it ends its turn."""
    return "none (no turn ends on an improvement)" if margin is None else f"{margin:g}"


def table(summary: dict[str, Any]) -> str:
    """The per-mode table and the ratios, as Markdown."""
    def fmt(x: Any, spec: str = ".2f") -> str:
        return "-" if x is None else format(x, spec)

    speed = summary["config"]["speed"]
    pace = ("reasoning at the timing model's real pace" if speed == 1 else
            f"reasoning {speed:g}x the timing model's pace while evaluation runs at its own: "
            "not the regime of a real run")
    engine = summary["config"].get("fork_engine")
    writer = "" if not engine else (f" ({engine['llm']} {engine.get('model', '')}"
                                    + (f" at {engine['base_url']}" if engine.get("base_url") else "")
                                    + ")")
    lines = [f"hardware: {summary['hardware']}; evaluation workers: "
             f"{devices_text(summary['config'].get('devices', []))}; fork model: "
             f"{summary['config']['fork_model']}{writer}; speed x{speed:g} ({pace}); "
             f"concurrency {summary['config']['concurrency']}; improvement margin "
             f"{margin_text(summary['config']['improvement_margin'])}",
             f"ceiling of draft harvesting (pooled, zero cost): {summary['ceiling']:.3f} of sequential time",
             f"named ceiling (a fork from the first naming of the answer's kernel writes it): "
             f"{summary.get('named_ceiling', 1.0):.3f} of sequential time", "",
             "| mode | end-to-end s (geo) | to near-best s (geo) | profiled | best speedup (geo) | tokens | feedback p50 s | util. of run | util. while work waits | util. while queued (s queued) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for mode, m in summary["per_mode"].items():
        u = summary["utilization"].get(mode, {})
        lines.append(f"| {mode} | {fmt(m['end_to_end_s']['geomean'], '.1f')} | "
                     f"{fmt(m['to_near_best_s']['geomean'], '.1f')} | {m['profiled_total']} | "
                     f"{fmt(m['best_speedup']['geomean'], '.3f')} | {m['tokens_total']} | "
                     f"{fmt(m['feedback_p50_s_median'])} | {fmt(u.get('of_run'), '.0%')} | "
                     f"{fmt(u.get('while_work_waits'), '.0%')} | "
                     f"{fmt(u.get('while_queued'), '.0%')} ({u.get('queued_s', 0.0):.0f}) |")
    lines += ["", "| mode | answers judged here | speculative candidates judged here |",
              "| --- | --- | --- |"]
    for mode, m in summary["per_mode"].items():
        lines.append(f"| {mode} | {m['answers_judged']} of {m['answers']} | "
                     f"{m['speculative_judged']} of {m['speculative']} |")
    lines += not_judged_lines(summary["evidence"], "all modes")
    if summary.get("no_headline"):
        lines += ["", summary["no_headline"]]
        return "\n".join(lines)
    r = summary["ratios"]
    if r:
        lines.append("")
        for key, label in (("end_to_end_s", "end-to-end"), ("to_near_best_s", "to near-best")):
            for suffix, against in (("", "best fair baseline"), ("_vs_sequential", "sequential")):
                g = r[key + suffix]
                lines.append(f"specgen / {against}, {label}: {fmt(g['geomean'], '.3f')} (95% CI "
                             f"{fmt(g['low'], '.3f')}-{fmt(g['high'], '.3f')} over {g['n']} "
                             "problems, one run)")
        if r.get("pipeline_not_a_baseline"):
            skipped = r["pipeline_not_a_baseline"]
            lines.append(f"pipeline is no baseline for {len(skipped)} problem(s): it began "
                         f"{sum(skipped.values())} turn(s) before the previous turn's verdict, "
                         "which a replayed trace (written after that verdict) gives it for free")
        lines += ceiling_lines(r["end_to_end_s_vs_sequential"]["geomean"], summary["ceiling"],
                               summary.get("named_ceiling", 1.0))
        lines.append(f"profiling feedback, specgen / sequential: {fmt(r['profiled_vs_sequential'])}x")
        lines.append(f"best speedup, specgen / best baseline: {fmt(r['best_speedup_vs_best_baseline'], '.3f')}")
    return "\n".join(lines)


def _save(fig: Any, path: Path) -> None:
    with open_private(path, "wb") as f:   # a private file, like the rest of the bench's folder
        fig.savefig(f, format="png", dpi=120)


def plot(run: BenchRun, summary: dict[str, Any], out: Path) -> list[Path]:
    """Best speedup over time per mode, the per-worker busy timeline, the ratio per problem."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    make_private_dir(out)
    paths = []
    colors = dict(zip(run.config["modes"], plt.rcParams["axes.prop_cycle"].by_key()["color"]))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for mode in run.config["modes"]:
        events = []
        for job in [j for j in run.jobs if j.mode == mode]:
            best = 0.0
            for c in sorted(job.result.candidates, key=lambda c: c.feedback_at or math.inf):
                if c.speedup is not None and c.feedback_at:
                    best = max(best, c.speedup)
                    events.append((c.feedback_at - job.result.started_at, job.problem, best))
        if not events:
            continue
        problems = sorted({p for _, p, _ in events})
        times = sorted({t for t, _, _ in events})
        current = {p: 0.0 for p in problems}
        ys = []
        for t in times:
            for tt, p, b in events:
                if tt == t:
                    current[p] = max(current[p], b)
            ys.append(float(np.mean(list(current.values()))))
        ax.step(times, ys, where="post", label=mode, color=colors.get(mode))
    ax.set_xlabel("seconds since job start")
    ax.set_ylabel("mean best speedup so far over problems")
    ax.set_title(f"Best speedup over time ({summary['hardware']})", fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no mode timed a correct kernel", ha="center", va="center",
                transform=ax.transAxes)
    fig.tight_layout()
    paths.append(out / "speedup_over_time.png")
    _save(fig, paths[-1])
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 4.5))
    rows: dict[tuple[int, str, str], int] = {}
    t0 = min((b.started_at for b in run.batches), default=0.0)
    for job in run.jobs:
        for worker, start, end in job.intervals:
            key = (job.batch, job.mode, worker)
            row = rows.setdefault(key, len(rows))
            ax.barh(row, end - start, left=start - t0, color=colors.get(job.mode), height=0.8)
    ax.set_yticks(list(rows.values()), [f"b{b} {m} {w}"[:40] for (b, m, w) in rows], fontsize=6)
    ax.set_xlabel("seconds since the run began")
    ax.set_title("Evaluation workers: busy intervals (building, validating, profiling)", fontsize=9)
    fig.tight_layout()
    paths.append(out / "worker_timeline.png")
    _save(fig, paths[-1])
    plt.close(fig)

    if {"specgen", "sequential"} <= set(run.config["modes"]):
        paths.append(out / "timeline_per_problem.png")
        _timeline_per_problem(plt, run, colors, paths[-1])

    ratio = summary["ratios"].get("end_to_end_s", {}).get("per_problem", {})
    if ratio:
        fig, ax = plt.subplots(figsize=(8, 4))
        names = sorted(ratio)
        ax.bar(range(len(names)), [ratio[n] for n in names], color=colors.get("specgen"))
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(summary["ceiling"], color="gray", linestyle="--", linewidth=0.8,
                   label="ceiling of draft harvesting")
        ax.set_xticks(range(len(names)), names, rotation=60, fontsize=7, ha="right")
        ax.set_ylabel("specgen / best fair baseline, end-to-end")
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out / "ratio_per_problem.png")
        _save(fig, paths[-1])
        plt.close(fig)
    return paths


_ORIGIN_MARKERS = {"final": "o", "fork": "^", "inline": "s"}


def _timeline_per_problem(plt: Any, run: BenchRun, colors: dict[str, str], path: Path) -> None:
    """Per problem, specgen's job above sequential's: the job's span, and each candidate's verdict
    where it arrived (shape: answer, fork or inline draft; filled: correct)."""
    jobs = {(j.mode, j.problem): j for j in run.jobs if j.mode in ("specgen", "sequential")}
    problems = sorted({p for _, p in jobs})
    fig, ax = plt.subplots(figsize=(9, 0.8 + 0.55 * len(problems)))
    ticks, labels = [], []
    for index, problem in enumerate(problems):
        for lane, mode in enumerate(("sequential", "specgen")):
            job = jobs.get((mode, problem))
            if job is None:
                continue
            y = index * 3 + lane
            ticks.append(y)
            labels.append(f"{problem[:24]} {mode}")
            ax.barh(y, job.result.metrics.end_to_end_s, color=colors.get(mode), alpha=0.35, height=0.7)
            for c in job.result.candidates:
                if c.feedback_at is None:
                    continue
                x = c.feedback_at - job.result.started_at
                correct = c.speedup is not None
                ax.scatter(x, y, marker=_ORIGIN_MARKERS.get(c.origin, "o"), s=22,
                           facecolors=colors.get(mode) if correct else "none",
                           edgecolors=colors.get(mode), linewidths=0.8)
    ax.set_yticks(ticks, labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the job began")
    ax.set_title("Per problem: specgen against sequential (bar: the job; marks: verdicts; "
                 "o answer, ^ fork, s inline draft; filled: correct)", fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
