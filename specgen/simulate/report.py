"""What `specgen simulate` writes: results.json, report.md and plots (utilization over time,
feedback latency CDF)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _f(x: Any, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def markdown(r: dict[str, Any], title: str = "specgen simulate") -> str:
    u, fb, e2e, dec = r["utilization"], r["feedback_latency_s"], r["end_to_end_s"], r["decision_time_s"]
    lines = [
        f"# {title}", "",
        f"{r['eval_gpus']} evaluation GPUs ({r['pools']} pools), {r['reasoning_engines']} reasoning "
        f"engine(s), {r['simulated_s'] / 3600:.3g} simulated hours in {r['real_s']:.1f} s real time.", "",
        "| figure | value |", "| --- | --- |",
        f"| utilization, all evaluation GPUs (busy worker-s / available) | {_f(u['all'])} |",
        f"| of the busy worker-s, waiting for a runner process to start | "
        f"{_f(r['runner_wait_s'] / busy if (busy := sum(r['busy_s'].values())) else None)} |",
        f"| utilization, validation pool (scheduler's measure) | {_f(u['validate_core'])} |",
        f"| utilization, profiling pool (scheduler's measure) | {_f(u['profile_core'])} |",
        f"| busy share while work waits | {_f(u['busy_while_waiting'])} (over {u['waiting_s']:.0f} s queued) |",
        f"| feedback latency p50 / p95 (s) | {_f(fb['p50'])} / {_f(fb['p95'])} (n = {fb['n']}) |",
        f"| jobs finished (running at the end) | {r['jobs_finished']} ({r['jobs_running']}) |",
        f"| end-to-end per job, p50 / mean (s) | {_f(e2e['p50'])} / {_f(e2e['mean'])} |",
        f"| scheduler decision time p50 / p99 (real us) | {_f(dec['p50'] and dec['p50'] * 1e6)} / "
        f"{_f(dec['p99'] and dec['p99'] * 1e6)} over {dec['calls']} calls |",
        f"| pool moves | {r['reassignments']} |",
        "", "Counts: " + ", ".join(f"{k} {v}" for k, v in r["counts"].items()), "",
    ]
    return "\n".join(lines)


def plot(r: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    s = r["samples"]
    if s:
        fig, ax = plt.subplots(figsize=(8, 3.5))
        t = [row["t"] / 60 for row in s]
        for pool, color in (("validate", "C0"), ("profile", "C3")):
            ax.plot(t, [row[f"{pool}_busy"] / row[f"{pool}_workers"] if row[f"{pool}_workers"] else 0
                        for row in s], color=color, label=f"{pool} pool busy share")
            ax.plot(t, [row[f"{pool}_workers"] / r["eval_gpus"] for row in s], linestyle=":",
                    color=color, label=f"{pool} pool size share")
        ax.set_xlabel("simulated minutes")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=7)
        ax.set_title("Evaluation pools over time", fontsize=9)
        fig.tight_layout()
        paths.append(out / "utilization.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    lat = r["feedback_latencies"]
    if lat:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))])
        ax.set_xlabel("feedback latency (s): extracted -> profiling verdict")
        ax.set_ylabel("share of candidates")
        ax.set_title("Feedback latency CDF", fontsize=9)
        fig.tight_layout()
        paths.append(out / "feedback_cdf.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def write(r: dict[str, Any], out: Path, extra: dict[str, Any] | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({**r, **(extra or {})}, indent=1, default=str))
    (out / "report.md").write_text(markdown(r))
    return [out / "results.json", out / "report.md", *plot(r, out)]
