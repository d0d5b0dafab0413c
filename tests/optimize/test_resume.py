"""A killed `specgen optimize` loses nothing: `--resume DIR` continues it, and no candidate is
lost or evaluated twice. A killed node or scheduler of its cluster is started again and the job
goes on; one that may not be ends the command at once with the `--resume` that continues it. The
bundled trace is replayed through the actor runtime on CPU workers, as real processes killed with
SIGKILL."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from specgen.messages import OptimizeResult
from specgen.optimize.outputs import JOURNAL_DIR, LOOP_JOURNAL, SCHEDULER_STATE, ResumedRun
from specgen.traces.bundled import bundled_problem

# A hand-written trace of several iterations (a run killed after its first one has more to do).
COMMAND = [sys.executable, "-m", "specgen.cli", "optimize", str(bundled_problem("fused_elementwise")),
           "--speed", "12", "--trials", "2",
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


# ------------------------------------------------------------- a process of the cluster killed

QUICK = COMMAND + ["--max-iterations", "1"]


def _cluster_pid(proc: subprocess.Popen, module: str) -> int:
    """The pid of the run's scheduler or node process (found in the command's process tree)."""
    from tests.runtime.conftest import descendants

    found = []
    for pid in descendants(proc.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if module.encode() in argv:
            found.append(pid)
    assert len(found) == 1, f"{module}: {found}"
    return found[0]


def _start_and_wait_for_a_verdict(out: Path, log: Path, *extra: str) -> subprocess.Popen:
    """`specgen optimize` started, and returned once its job journaled its first verdict."""
    with log.open("wb") as err:
        proc = subprocess.Popen(QUICK + list(extra) + ["--out", str(out)], stdout=err, stderr=err)
    deadline = time.monotonic() + 240
    while not any(b'"kind":"update"' in line for line in _journal_lines(out)):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the run ended or stalled before a verdict:\n{log.read_text()}")
        time.sleep(0.05)
    return proc


def _kill_and_wait(proc: subprocess.Popen, pid: int, timeout: float) -> float:
    """SIGKILL `pid`; the seconds until the command ended (AssertionError if it did not: a hang)."""
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"specgen optimize still running {timeout:g} s after the kill") from None
    return time.monotonic() - killed


def _check_the_job_went_on(out: Path, before: ResumedRun, log: Path) -> OptimizeResult:
    """Finished, every verdict journaled before the kill kept as it was, none evaluated twice."""
    assert (out / "result.json").is_file(), log.read_text()
    result = msgspec.json.decode((out / "result.json").read_bytes(), type=OptimizeResult)
    assert result.status == "iterations_done", log.read_text()
    by_id = {c.candidate_id: c for c in result.candidates}
    for upd in before.updates:
        got = by_id[upd.candidate_id]
        assert (got.validation if upd.stage == "validate" else got.profile) == upd
    after = ResumedRun.read(_job_dir(out))
    keys = [(u.candidate_id, u.stage) for u in after.updates]
    assert len(keys) == len(set(keys)), f"a stage was evaluated twice: {keys}"
    assert set(before.candidates) <= set(after.candidates)
    return result


def _job_attempts(out: Path) -> tuple[int, list[str]]:
    """How often the scheduler started the job's reasoner, and the job's events (from its journal)."""
    from specgen.runtime.journal import Journal

    journal = Journal(out / JOURNAL_DIR / SCHEDULER_STATE / "journal.sqlite3")
    try:
        record = journal.job(_job_dir(out).name)
        assert record is not None
        events = [f"{e.kind} {e.data}" for e in journal.events_after(record.spec.job_id, 0)
                  if e.kind not in ("update", "candidate")]
        return record.attempts, events
    finally:
        journal.close()


def test_a_killed_node_is_started_again_and_the_job_goes_on(tmp_path) -> None:
    out, log = tmp_path / "run", tmp_path / "run.log"
    proc = _start_and_wait_for_a_verdict(out, log)
    before = ResumedRun.read(_job_dir(out))
    node = _cluster_pid(proc, "specgen.runtime.node")
    _kill_and_wait(proc, node, timeout=180)
    assert proc.returncode == 0, log.read_text()
    assert f"node0 (pid {node}) was killed by SIGKILL: starting it again" in log.read_text()
    _check_the_job_went_on(out, before, log)
    attempts, events = _job_attempts(out)
    assert attempts == 1, events                 # the job's reasoner never stopped


def test_a_killed_scheduler_is_started_again_and_the_job_continues_from_its_journal(tmp_path) -> None:
    out, log = tmp_path / "run", tmp_path / "run.log"
    proc = _start_and_wait_for_a_verdict(out, log)
    before = ResumedRun.read(_job_dir(out))
    scheduler = _cluster_pid(proc, "specgen.runtime.scheduler")
    _kill_and_wait(proc, scheduler, timeout=180)
    assert proc.returncode == 0, log.read_text()
    assert f"scheduler (pid {scheduler}) was killed by SIGKILL: starting it again" in log.read_text()
    result = _check_the_job_went_on(out, before, log)
    # The restarted scheduler resumed the job: a second reasoner continued from the journal, with
    # the candidates of the first (found before the kill) in the result.
    attempts, events = _job_attempts(out)
    assert attempts == 2, events
    assert set(before.candidates) <= {c.candidate_id for c in result.candidates}


def test_a_node_that_may_not_be_restarted_ends_the_run_with_one_line_naming_resume(tmp_path) -> None:
    out, log = tmp_path / "run", tmp_path / "run.log"
    proc = _start_and_wait_for_a_verdict(out, log, "--set", "cluster_max_restarts=0")
    node = _cluster_pid(proc, "specgen.runtime.node")
    took = _kill_and_wait(proc, node, timeout=30)
    assert proc.returncode == 1 and took < 30, log.read_text()
    [line] = [line for line in log.read_text().splitlines() if "error" in line]
    assert line == (f"specgen optimize: error: the local cluster's node0 (pid {node}) was killed by "
                    f"SIGKILL and is not started again (setting cluster_max_restarts=0); continue "
                    f"the run with: specgen optimize --resume {out}")
    assert not (out / "result.json").exists()
    deadline = time.monotonic() + 30                # the rest of the cluster was stopped
    while _cluster_processes(out) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _cluster_processes(out)
