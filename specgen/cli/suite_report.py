"""A suite's results: per problem and mode, the suite in KernelBench's terms, mode against mode.

From the journal's rows (optimize/suite.py, `job_row`), written to the results folder:

- `kernels/PROBLEM.MODE.py`: the best correct kernel of that problem and mode over its repeats;
- per problem and mode: that best kernel's speedup and correctness, and the means over repeats of
  end-to-end time, tokens, iterations and profiling feedback (verdicts received);
- per mode, KernelBench's fast_p: the share of the suite's problems whose best kernel is correct
  and more than p times as fast as the reference, for p = 0, 1, 1.5, 2 (a problem without a
  finished job of that mode counts as not solved: the denominator is every problem of the plan),
  and the geometric mean of the correct kernels' speedups with a 95% bootstrap interval
  (`bench/report.geomean_ci`, the bench's own);
- mode against mode: the first mode's end-to-end time over each other mode's, one ratio per
  problem and repeat where both jobs finished (not failed), their geometric mean with a 95%
  bootstrap interval over those (problem, repeat) pairs, and the ratio per problem;
- `results.json` (all of it), `report.md` (the tables), `plots/speedup.png` and
  `plots/end_to_end.png` (per problem, a bar per mode).
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

FAST_P = (0.0, 1.0, 1.5, 2.0)
# A job that failed ran no comparable course: its time is no end-to-end time of the mode.
_NOT_TIMED = ("failed", "cancelled")


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def per_problem(plan: Any, rows: list[dict[str, Any]], out: Path) -> dict[str, dict[str, Any]]:
    """{problem: {mode: figures}}; copies each best kernel to kernels/."""
    from specgen.runtime.private_files import make_private_dir

    table: dict[str, dict[str, Any]] = {}
    for problem in plan.problems:
        table[problem.name] = {}
        for mode in plan.modes:
            mine = sorted((r for r in rows if r["problem"] == problem.name and r["mode"] == mode),
                          key=lambda r: r["repeat"])
            if not mine:
                continue
            correct = [r for r in mine if r["correct"] and r.get("speedup")]
            best = max(correct, key=lambda r: r["speedup"]) if correct else None
            kernel = None
            if best is not None and best.get("best_kernel") and (out / best["best_kernel"]).is_file():
                kernel = make_private_dir(out / "kernels") / f"{problem.name}.{mode}.py"
                shutil.copyfile(out / best["best_kernel"], kernel)
            timed = [r for r in mine if r["status"] not in _NOT_TIMED]
            table[problem.name][mode] = {
                "repeats": len(mine),
                "correct": best is not None,
                "speedup": best["speedup"] if best else None,
                "cpu_timing": bool(best and best.get("cpu_timing")),
                "best_kernel": str(kernel.relative_to(out)) if kernel else None,
                "best_repeat": best["repeat"] if best else None,
                "end_to_end_s": _mean([r["end_to_end_s"] for r in timed]),
                "tokens": _mean([r["tokens"] for r in mine]),
                "iterations": _mean([r["iterations"] for r in mine]),
                "feedback": _mean([r["feedback"] for r in mine]),
                "statuses": [r["status"] for r in mine],
                "errors": [r["error"] for r in mine if r.get("error")],
            }
    return table


def per_mode(plan: Any, table: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    from specgen.bench.report import geomean_ci

    summary: dict[str, dict[str, Any]] = {}
    problems = len(plan.problems)
    for mode in plan.modes:
        cells = [table[p.name].get(mode) for p in plan.problems]
        speedups = [c["speedup"] for c in cells if c and c["correct"]]
        summary[mode] = {
            "problems": problems,
            "finished": sum(1 for c in cells if c),
            "fast_p": {f"{p:g}": (sum(1 for s in speedups if s > p) / problems if problems else None)
                       for p in FAST_P},
            "geomean_speedup": geomean_ci(speedups),
            "end_to_end_s": _mean([c["end_to_end_s"] for c in cells if c]),
            "tokens": _mean([c["tokens"] for c in cells if c]),
        }
    return summary


def mode_ratios(plan: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first mode's end-to-end time over each other mode's (module docstring)."""
    from specgen.bench.report import geomean_ci

    timed = {(r["problem"], r["mode"], r["repeat"]): r["end_to_end_s"] for r in rows
             if r["status"] not in _NOT_TIMED and r["end_to_end_s"] and r["end_to_end_s"] > 0}
    first = plan.modes[0]
    found = []
    for other in plan.modes[1:]:
        pairs: dict[str, list[float]] = {}
        for problem in plan.problems:
            for repeat in range(plan.repeats):
                a = timed.get((problem.name, first, repeat))
                b = timed.get((problem.name, other, repeat))
                if a and b:
                    pairs.setdefault(problem.name, []).append(a / b)
        ratios = [x for values in pairs.values() for x in values]
        found.append({
            "modes": [first, other], "what": f"{first} / {other}, end-to-end time",
            "pairs": len(ratios), **geomean_ci(ratios),
            "per_problem": {name: math.exp(sum(math.log(x) for x in values) / len(values))
                            for name, values in pairs.items()},
        })
    return found


def _fmt(x: Any, spec: str = ".2f", none: str = "-") -> str:
    return none if x is None else format(x, spec)


def ran_on(plan: Any, rows: list[dict[str, Any]]) -> str:
    """How the suite ran, as it was: the engine and its pace, the evaluation devices the verdicts
    came from (not the ones asked for), the cluster and how many jobs at once."""
    options = plan.options
    llm = options.get("llm") or "replay"
    if llm == "replay":
        engine = f"replayed bundled traces at {options.get('speed', 1.0):g}x their pace"
    else:
        engine = f"{llm} engine, model {options.get('model') or '-'}" + (
            f" at {options['base_url']}" if options.get("base_url") else "")
    devices = sorted({r["device"] for r in rows if r.get("device")})
    where = options.get("scheduler") or ("this process (in-process evaluation)"
                                         if options.get("evaluation") == "inprocess" else "a local cluster")
    return (f"Ran: {engine}; verdicts from {', '.join(devices) or 'no device (no correct kernel)'}; "
            f"jobs on {where}, {options.get('concurrency') or 1} at once.")


def render(plan: Any, table: dict[str, dict[str, Any]], modes: dict[str, dict[str, Any]],
           ratios: list[dict[str, Any]], cpu: bool, rows: list[dict[str, Any]] = ()) -> str:
    lines = [f"# Suite: {len(plan.problems)} problem(s), modes {', '.join(plan.modes)}, "
             f"{plan.repeats} repeat(s)", "", ran_on(plan, list(rows)), ""]
    if cpu:
        lines += ["Speedups are CPU timings (no GPU evaluated them).", ""]
    lines += ["## Per problem and mode", "",
              "best speedup (correct: yes/no), mean end-to-end seconds, tokens, iterations and "
              "profiling feedback over the repeats", "",
              "| problem | mode | correct | speedup | end-to-end s | tokens | iterations | feedback | status |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for problem in plan.problems:
        for mode in plan.modes:
            cell = table[problem.name].get(mode)
            if cell is None:
                lines.append(f"| {problem.name} | {mode} | - | - | - | - | - | - | not run |")
                continue
            lines.append(
                f"| {problem.name} | {mode} | {'yes' if cell['correct'] else 'no'} | "
                f"{_fmt(cell['speedup'], '.2f')}{'x' if cell['speedup'] is not None else ''} | "
                f"{_fmt(cell['end_to_end_s'], '.1f')} | {_fmt(cell['tokens'], ',.0f')} | "
                f"{_fmt(cell['iterations'], '.1f')} | {_fmt(cell['feedback'], '.1f')} | "
                f"{', '.join(sorted(set(cell['statuses'])))} |")
    lines += ["", "## Per mode (KernelBench's terms)", "",
              "fast_p: share of all problems whose best kernel is correct and faster than p x the "
              "reference; geomean: geometric mean speedup of the correct kernels (95% bootstrap "
              "interval over problems)", "",
              "| mode | fast_0 | fast_1 | fast_1.5 | fast_2 | geomean speedup | 95% CI | mean end-to-end s |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for mode, figures in modes.items():
        fast = figures["fast_p"]
        geo = figures["geomean_speedup"]
        lines.append(f"| {mode} | " + " | ".join(_fmt(fast[f"{p:g}"], ".2f") for p in FAST_P)
                     + f" | {_fmt(geo['geomean'], '.3f')} | {_fmt(geo['low'], '.3f')}-"
                       f"{_fmt(geo['high'], '.3f')} | {_fmt(figures['end_to_end_s'], '.1f')} |")
    if ratios:
        lines += ["", "## Mode against mode", "",
                  "end-to-end time ratio (below 1: the first mode finished sooner), geometric mean "
                  "over (problem, repeat) pairs, 95% bootstrap interval over those pairs", "",
                  "| ratio | geomean | 95% CI | pairs | per problem |", "| --- | --- | --- | --- | --- |"]
        for ratio in ratios:
            each = ", ".join(f"{name} {value:.3f}" for name, value in ratio["per_problem"].items())
            lines.append(f"| {ratio['what']} | {_fmt(ratio['geomean'], '.3f')} | "
                         f"{_fmt(ratio['low'], '.3f')}-{_fmt(ratio['high'], '.3f')} | "
                         f"{ratio['pairs']} | {each or '-'} |")
    return "\n".join(lines) + "\n"


def plot(plan: Any, table: dict[str, dict[str, Any]], out: Path) -> list[Path]:
    """A bar per mode for each problem: best speedup, and mean end-to-end time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specgen.runtime.private_files import make_private_dir

    folder = make_private_dir(out / "plots")
    names = [p.name for p in plan.problems]
    width = 0.8 / max(1, len(plan.modes))
    written = []
    for key, label, file in (("speedup", "best correct speedup (x reference; 0: none)", "speedup.png"),
                             ("end_to_end_s", "end-to-end time (s, mean over repeats)", "end_to_end.png")):
        fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(names) * len(plan.modes) + 2), 4))
        for i, mode in enumerate(plan.modes):
            values = [(table[n].get(mode) or {}).get(key) or 0.0 for n in names]
            ax.bar([x + i * width for x in range(len(names))], values, width, label=mode)
        if key == "speedup":
            ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xticks([x + width * (len(plan.modes) - 1) / 2 for x in range(len(names))])
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.legend()
        fig.tight_layout()
        path = folder / file
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def write_report(out: Path, plan: Any, rows: list[dict[str, Any]]) -> str:
    """results.json, report.md, kernels/ and plots/ from the finished jobs' rows; the report's
    text, to print."""
    from specgen.runtime.private_files import write_private

    table = per_problem(plan, rows, out)
    modes = per_mode(plan, table)
    ratios = mode_ratios(plan, rows)
    cpu = any(r.get("cpu_timing") and r.get("correct") for r in rows)
    text = render(plan, table, modes, ratios, cpu, rows)
    try:
        plots = [str(p.relative_to(out)) for p in plot(plan, table, out)]
    except Exception as exc:   # the figures are in the tables; a plot that fails loses none
        plots = [f"(no plots: {exc})"]
    results = {"plan": plan.to_json(), "jobs": rows, "per_problem": table, "per_mode": modes,
               "mode_ratios": ratios, "cpu_timing": cpu, "plots": plots,
               "complete": len(rows) == len(plan.keys())}
    write_private(out / "results.json", json.dumps(results, indent=2, default=str) + "\n")
    write_private(out / "report.md", text)
    return text
