"""`specgen optimize --scheduler ADDR`: the job runs on a running scheduler and its nodes (its
reasoner and evaluations in the cluster), the command follows it and writes the same outputs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specgen.cli import main
from specgen.runtime.local import LocalCluster
from specgen.traces.bundled import bundled_problem

# A problem with a hand-written trace of several iterations (the runtime behaviour under test needs
# a job that is still running after its first one), named rather than left to the host's default.
SEVERAL_ITERATIONS = str(bundled_problem("fused_elementwise"))

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
    # --set there takes only the settings of the command's own connection.
    assert main(["optimize", "--scheduler", "tcp://127.0.0.1:9", "--set", "pool_mode=static",
                 "--set", "scheduler_timeout_s=5", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--set pool_mode cannot go with --scheduler" in err and "scheduler_timeout_s" in err


def test_a_scheduler_that_dies_under_a_follower_ends_it_in_bounded_time(tmp_path: Path) -> None:
    """`specgen optimize --scheduler ADDR` whose scheduler is killed mid-job: one error line naming
    the setting scheduler_timeout_s, within that time (not a follower waiting forever)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    with LocalCluster(workers=1, state_dir=tmp_path / "state") as cluster:
        follower = subprocess.Popen([sys.executable, "-m", "specgen.cli", "optimize", SEVERAL_ITERATIONS,
                                     "--scheduler", cluster.address,
                                     "--speed", "12", "--quiet", "--set", "scheduler_timeout_s=3",
                                     "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 120
            while not ((out / "events.jsonl").exists() and (out / "events.jsonl").read_bytes()):
                assert follower.poll() is None and time.monotonic() < deadline, "the job never started"
                time.sleep(0.05)
            os.kill(cluster.scheduler.pid, signal.SIGKILL)
            killed = time.monotonic()
            _, err = follower.communicate(timeout=30)
            took = time.monotonic() - killed
        finally:
            if follower.poll() is None:
                follower.kill()
    lines = err.decode().splitlines()
    assert follower.returncode == 1 and took < 3 + 5, (took, lines)
    [line] = [line for line in lines if "error" in line]
    assert line.startswith(f"specgen optimize: error: the scheduler at {cluster.address} has said "
                           "nothing for ") and "(setting scheduler_timeout_s=3)" in line
    assert "stays in that scheduler's journal" in line


def test_a_killed_reasoner_continues_from_its_journal(tmp_path: Path) -> None:
    """SIGKILL the reasoner of a scheduler job once its first iteration is journaled: the scheduler
    starts it again, and the new one continues from the journal in the job's folder (the completed
    iteration stands and is not run again) instead of starting over; nothing is evaluated twice."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import msgspec

    from specgen.messages import OptimizeResult
    from specgen.optimize.outputs import JOURNAL_DIR, LOOP_JOURNAL, ResumedRun
    from tests.runtime.conftest import descendants

    out, state = tmp_path / "run", tmp_path / "state"
    with LocalCluster(workers=2, state_dir=state) as cluster:
        follower = subprocess.Popen([sys.executable, "-m", "specgen.cli", "optimize", SEVERAL_ITERATIONS,
                                     "--scheduler", cluster.address,
                                     "--speed", "12", "--quiet", "--out", str(out)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 240
            journal = None
            while time.monotonic() < deadline and follower.poll() is None:
                found = list((state / "jobs").glob(f"*/{JOURNAL_DIR}/{LOOP_JOURNAL}"))
                if found and b'"kind":"iteration"' in found[0].read_bytes():
                    journal = found[0]
                    break
                time.sleep(0.05)
            assert journal is not None, "the job never journaled an iteration"
            before = ResumedRun.read(journal.parent.parent)
            (victim,) = [p for p in descendants(cluster.scheduler.pid)
                         if b"specgen.runtime.reasoner" in Path(f"/proc/{p}/cmdline").read_bytes()]
            os.kill(victim, signal.SIGKILL)
            _, err = follower.communicate(timeout=300)
        finally:
            if follower.poll() is None:
                follower.kill()
    assert follower.returncode == 0, err.decode()
    result = msgspec.json.decode((out / "result.json").read_bytes(), type=OptimizeResult)
    assert result.status in ("iterations_done", "target_reached")
    assert result.iterations[0] == before.iterations[0]          # the completed iteration stands
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert sum(e["kind"] == "iteration_started" and e.get("iteration", 0) == 0 for e in events) == 1, \
        "the first iteration ran again"
    evaluated = [(c.candidate_id, u.stage) for c in result.candidates for u in (c.validation, c.profile) if u]
    assert len(evaluated) == len(set(evaluated))
