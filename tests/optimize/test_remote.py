"""`specgen optimize --scheduler ADDR`: the job runs on a running scheduler and its nodes (its
reasoner and evaluations in the cluster), the command follows it and writes the same outputs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specgen.cli import main
from specgen.runtime.local import LocalCluster

pytestmark = pytest.mark.slow


def test_a_job_submitted_to_a_scheduler_runs_there(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    with LocalCluster(workers=2) as cluster:
        code = main(["optimize", "--scheduler", cluster.address, "--speed", "20", "--out", str(out)])
        stats = cluster.client.stats()
    assert code == 0
    said = capsys.readouterr().err
    assert "Submitted job" in said and "reasoner started (attempt 1)" in said
    result = json.loads((out / "result.json").read_text())
    assert result["status"] in ("iterations_done", "target_reached")
    assert result["metrics"]["profiled"] >= 1 and result["best_source"]
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert events[0]["kind"] == "job_started" and events[-1]["kind"] == "job_finished"
    assert stats.jobs_by_state.get("succeeded") == 1 and "running" not in stats.jobs_by_state


def test_local_only_flags_do_not_go_with_a_scheduler(capsys) -> None:
    assert main(["optimize", "--scheduler", "tcp://127.0.0.1:9", "--devices", "cpu", "--quiet"]) == 2
    assert "--devices cannot go with --scheduler" in capsys.readouterr().err
