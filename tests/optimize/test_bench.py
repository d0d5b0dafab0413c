"""`specgen bench` end to end on the CPU: generated traces, two modes, real evaluation, the report."""
from __future__ import annotations

import json
import math
import stat
from pathlib import Path

import pytest

from specgen.cli import main
from specgen.optimize.bench_report import _union, geomean_ci


def test_union_and_geomean() -> None:
    assert _union([(0, 2), (1, 3), (5, 6)]) == 4   # [0, 3] and [5, 6]
    ci = geomean_ci([0.5, 0.5, 0.5])
    assert ci["geomean"] == pytest.approx(0.5) and ci["low"] == pytest.approx(0.5)
    wide = geomean_ci([0.25, 1.0, 4.0])
    assert wide["geomean"] == pytest.approx(1.0) and wide["low"] < 1.0 < wide["high"]
    assert geomean_ci([])["geomean"] is None


def test_bench_runs_modes_side_by_side_and_reports(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench"
    code = main(["bench", "--generate", "2", "--turns", "1", "--concurrency", "2", "--speed", "40",
                 "--modes", "specgen,sequential", "--problems", "softmax", "--seed", "3",
                 "--eval-timeout", "120", "--out", str(out), "--quiet"])
    assert code == 0
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["fork_model"] == "draft" and "CPU timing" in data["hardware"]
    assert data["config"]["eval_timeout_s"] == 120
    assert {(j["mode"], j["problem"]) for j in data["jobs"]} == {
        (m, p) for m in ("specgen", "sequential") for p in ("softmax#0", "softmax#1")}
    for job in data["jobs"]:
        assert job["end_to_end_s"] > 0 and job["tokens"] > 0
    for mode in ("specgen", "sequential"):
        u = data["utilization"][mode]["of_run"]
        assert u is not None and 0 < u <= 1
        queued = data["utilization"][mode]["while_queued"]     # the scheduler's own measure
        assert queued is None or 0 <= queued <= 1
    assert all("busy_while_queued" in b for b in data["batches"])
    # Each evaluation names its program, so the simulator can take its measured verdicts.
    evaluations = [e for job in data["intervals"] for e in job["evaluations"]]
    assert evaluations and all(len(e["program"]) >= 16 for e in evaluations)
    ratio = data["ratios"]["end_to_end_s"]
    assert ratio["n"] == 2 and math.isfinite(ratio["geomean"])
    assert 0 < data["ceiling"] <= 1
    report = (out / "report.md").read_text()
    assert "specgen / best baseline, end-to-end" in report
    for png in ("speedup_over_time.png", "worker_timeline.png", "ratio_per_problem.png"):
        assert (out / png).stat().st_size > 1000
    # The bench's folder and what it writes there are private (its jobs' problems and kernels).
    # The evaluation cache in it is the workers' (sandboxed runners of another user read it through
    # a view of their own, so its own mode lets them in); the folder around it keeps others out.
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    for path in out.iterdir():
        if path.name != "eval-cache":
            assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path


def test_bench_bad_input_is_a_usage_error(tmp_path: Path, capsys) -> None:
    assert main(["bench", "--out", str(tmp_path)]) == 2
    assert "give trace files or --generate N" in capsys.readouterr().err
    assert main(["bench", "--generate", "1", "--fork-model", "model", "--out", str(tmp_path)]) == 2
    assert main(["bench", "--generate", "1", "--timing", "warp=9", "--out", str(tmp_path)]) == 2
    assert "unknown setting 'warp'" in capsys.readouterr().err
