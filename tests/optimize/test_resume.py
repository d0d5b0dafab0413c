"""A killed `specgen optimize` loses nothing: `--resume DIR` continues it, and no candidate is
lost or evaluated twice. The bundled trace is replayed through the actor runtime on CPU workers,
as a real process killed with SIGKILL."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from specgen.messages import OptimizeResult
from specgen.optimize.outputs import JOURNAL_DIR, LOOP_JOURNAL, SCHEDULER_STATE, ResumedRun

COMMAND = [sys.executable, "-m", "specgen.cli", "optimize", "--speed", "12", "--trials", "2",
           "--timing-trials", "5", "--devices", "cpu,cpu", "--quiet"]


def _job_dir(out: Path) -> Path:
    """The job's folder in the run's scheduler state, where its reasoner journals the loop."""
    found = sorted((out / JOURNAL_DIR / SCHEDULER_STATE / "jobs").glob("*"))
    return found[0] if found else out / "no-job-yet"


def _journal_lines(out: Path) -> list[bytes]:
    path = _job_dir(out) / JOURNAL_DIR / LOOP_JOURNAL
    return path.read_bytes().splitlines() if path.exists() else []


def _cluster_processes(out: Path) -> list[int]:
    """Processes of the killed run's cluster still up (their command lines name its journal)."""
    mark = str(out / JOURNAL_DIR).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _kill_mid_job(out: Path, log: Path) -> None:
    with log.open("wb") as err:
        proc = subprocess.Popen(COMMAND + ["--out", str(out)], stdout=err, stderr=err)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            lines = _journal_lines(out)
            iteration_done = next((i for i, line in enumerate(lines) if b'"kind":"iteration"' in line), None)
            # The first iteration journaled and a verdict of the second one in: mid-job.
            if iteration_done is not None and any(b'"kind":"update"' in line
                                                  for line in lines[iteration_done + 1:]):
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"the run ended before it could be killed:\n{log.read_text()}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Its scheduler and node stop on their own once their parent is gone (PR_SET_PDEATHSIG).
    deadline = time.monotonic() + 60
    while _cluster_processes(out) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _cluster_processes(out)


def test_a_killed_run_resumes_losing_nothing_and_evaluating_nothing_twice(tmp_path) -> None:
    out = tmp_path / "run"
    _kill_mid_job(out, tmp_path / "first.log")
    assert not (out / "result.json").exists()
    before = ResumedRun.read(_job_dir(out))
    assert len(before.iterations) == 1 and before.updates

    resumed = subprocess.run(COMMAND[:4] + ["--resume", str(out)], capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    result = msgspec.json.decode((out / "result.json").read_bytes(), type=OptimizeResult)
    assert result.status == "iterations_done" and len(result.iterations) == 2
    assert [it.index for it in result.iterations] == [0, 1]
    assert result.iterations[0] == before.iterations[0]          # a completed iteration stands
    by_id = {c.candidate_id: c for c in result.candidates}

    # Nothing lost: every candidate found before the kill is in the result, with its program.
    for cid, record in before.candidates.items():
        assert by_id[cid].source == record.source and by_id[cid].fingerprint == record.fingerprint
    # Verdicts journaled before the kill carry over as they were (same worker, same times).
    for upd in before.updates:
        got = by_id[upd.candidate_id]
        assert (got.validation if upd.stage == "validate" else got.profile) == upd

    # Nothing evaluated twice: one candidate id per program, one verdict per candidate and stage.
    evaluated = [c for c in result.candidates if c.duplicate_of is None]
    assert len({c.fingerprint for c in evaluated}) == len(evaluated)
    after = ResumedRun.read(_job_dir(out))
    keys = [(u.candidate_id, u.stage) for u in after.updates]
    assert len(keys) == len(set(keys))
    assert set(after.candidates) == set(by_id)

    # The result holds every verdict: each journaled one, and one for every evaluated candidate.
    for upd in after.updates:
        got = by_id[upd.candidate_id]
        assert (got.validation if upd.stage == "validate" else got.profile) == upd
    for c in evaluated:
        assert c.status in ("correct", "incorrect", "failed") and c.validation is not None, c
    assert result.best_speedup is not None
    assert (out / "best_kernel.py").read_text() == result.best_source
    events = (out / "events.jsonl").read_text()
    assert events.count('"kind":"job_started"') == 2           # both parts of the story

    again = subprocess.run(COMMAND[:4] + ["--resume", str(out)], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0 and "finished" in again.stdout, again.stderr


def test_resume_of_a_directory_that_is_no_run_names_the_missing_file(tmp_path) -> None:
    empty = tmp_path / "nothing"
    empty.mkdir()
    done = subprocess.run(COMMAND[:4] + ["--resume", str(empty)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert str(empty / JOURNAL_DIR / "run.json") in done.stderr and "Traceback" not in done.stderr
