"""The client against a real local cluster: direct evaluations, jobs, cancel, scheduler restart."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from specgen.errors import UsageError
from specgen.runtime.client import Client
from specgen.runtime.local import LocalCluster
from specgen.runtime.transport import RemoteError

from tests.runtime.conftest import SLOW_CORRECT, WRONG, alive, descendants, quick_eval_settings, wait_for

ENTRY = "specgen.runtime.jobs:evaluate_candidates"


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(workers=2, settings=quick_eval_settings()) as c:
        yield c


def test_direct_evaluation_returns_real_verdicts(cluster: LocalCluster, softmax_problem: str,
                                                 softmax_candidate: str) -> None:
    good = cluster.client.evaluate(softmax_problem, softmax_candidate, stage="full")
    assert good.correct and good.speedup is not None and good.stage == "full" and good.cpu_timing
    bad = cluster.client.evaluate(softmax_problem, WRONG, stage="validate")
    assert not bad.correct and "mismatch" in (bad.error or "")
    with pytest.raises(UsageError, match="stage must be"):
        cluster.client.evaluate(softmax_problem, WRONG, stage="everything")


def test_job_streams_events_and_returns_its_best_candidate(cluster: LocalCluster, softmax_problem: str,
                                                           softmax_candidate: str) -> None:
    job = cluster.client.submit(softmax_problem, entry=ENTRY, wall_time_s=300, options={
        "candidates": {"good": softmax_candidate, "wrong": WRONG}})
    events = list(job.events(timeout=180))
    kinds = [e.kind for e in events]
    assert kinds[0] == "created" and kinds[-1] == "finished" and "reasoner_started" in kinds
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    result = job.result(timeout=10)
    assert result.status == "succeeded" and result.best_candidate_id == "good"
    assert result.best_verdict is not None and result.best_verdict.correct
    # Another client may not follow the job (it is its owner's); the cluster's admin may, on a
    # connection of its own, and gets the whole history from the journal.
    with Client(cluster.address, settings=cluster.settings) as other:
        with pytest.raises(RemoteError, match="not_owner"):
            other.job(job.job_id)
    with Client(cluster.address, settings=cluster.settings, join_secret=cluster.join_secret) as admin:
        again = [e.kind for e in admin.job(job.job_id).events(timeout=10)]
    assert again == kinds


def test_cancel_stops_the_reasoner_and_the_jobs_evaluations(cluster: LocalCluster, softmax_problem: str) -> None:
    job = cluster.client.submit(softmax_problem, entry=ENTRY, options={
        "candidates": {f"slow{i}": SLOW_CORRECT.replace("0.4", f"0.4{i}") for i in range(6)}})
    wait_for(lambda: any(w.busy_candidate.startswith(job.job_id) for w in cluster.client.stats().workers),
             120, "the job's first evaluation to start")
    job.cancel()
    result = job.result(timeout=30)
    assert result.status == "cancelled"
    # Queued work is dropped, running work is stopped: the workers are free again soon.
    wait_for(lambda: not any(w.busy_stage for w in cluster.client.stats().workers), 30,
             "the cancelled evaluations to stop")
    reasoners = [p for p in descendants(cluster.scheduler.pid)
                 if b"specgen.runtime.reasoner" in Path(f"/proc/{p}/cmdline").read_bytes()]
    wait_for(lambda: not alive(set(reasoners)), 15, "the reasoner to exit")
    events = list(job.events(timeout=10))
    dropped = [e for e in events if e.kind == "verdict" and e.data["cancelled"]]
    assert dropped, "queued candidates were dropped with a cancelled verdict"
    with pytest.raises(RemoteError, match="unknown_job"):
        cluster.client.cancel_job("no-such-job")


def test_reasoner_killed_mid_job_is_started_again_and_the_job_goes_on(cluster: LocalCluster, softmax_problem: str,
                                                                       softmax_candidate: str) -> None:
    candidates = {"slow0": SLOW_CORRECT.replace("0.4", "0.43"), "fast": softmax_candidate, "wrong": WRONG,
                  "slow1": SLOW_CORRECT.replace("0.4", "0.44")}
    job = cluster.client.submit(softmax_problem, entry=ENTRY, wall_time_s=300,
                                options={"candidates": candidates, "submit_interval_s": 0.5})
    first = next(e for e in job.events(timeout=120) if e.kind == "verdict")

    def cmdline(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""          # it exited since it was listed

    def reasoners() -> list[int]:
        return [p for p in descendants(cluster.scheduler.pid)
                if job.job_id.encode() in cmdline(p) and b"specgen.runtime.reasoner" in cmdline(p)]

    (victim,) = reasoners()
    os.kill(victim, signal.SIGKILL)
    result = job.result(timeout=300)
    events = [first, *job.events(timeout=30)]
    restarted = [e for e in events if e.kind == "reasoner_restarted"]
    assert len(restarted) == 1 and restarted[0].data["exit_code"] != 0
    keys = [(e.data["candidate_id"], e.data["stage"]) for e in events if e.kind == "verdict"]
    assert len(keys) == len(set(keys)), f"a stage was reported twice: {keys}"
    assert {k for k in keys if k[1] == "validate"} == {(c, "validate") for c in candidates}
    assert result.status == "succeeded" and result.summary["validated"] == 4
    assert job.status().attempts == 2
    assert victim not in reasoners()


def test_bad_problem_input_is_refused_with_a_clear_message(cluster: LocalCluster, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not found"):
        cluster.client.submit(tmp_path / "missing.py")
    with pytest.raises(UsageError, match="KernelBench-format"):
        cluster.client.submit("print('hello')")
    # Any client can create jobs (of its own), so a job runs only an entry the scheduler's settings allow.
    with pytest.raises(RemoteError, match="not one this scheduler runs.*job_entries"):
        cluster.client.submit("class Model:\n    pass\n", entry="os:system")


def test_scheduler_killed_and_restarted_resumes_the_job(tmp_path: Path, softmax_problem: str,
                                                        softmax_candidate: str) -> None:
    cluster = LocalCluster(workers=2, settings=quick_eval_settings(), state_dir=tmp_path / "state").start()
    try:
        candidates = {"slow0": SLOW_CORRECT, "slow1": SLOW_CORRECT.replace("0.4", "0.41"),
                      "fast": softmax_candidate, "wrong": WRONG}
        job = cluster.client.submit(softmax_problem, entry=ENTRY, options={"candidates": candidates,
                                                                           "submit_interval_s": 0.5})
        first = next(e for e in job.events(timeout=120) if e.kind == "verdict")
        assert first.data["stage"] in ("validate", "profile")
        old_id = cluster.client.conn.scheduler_id
        os.kill(cluster.scheduler.pid, signal.SIGKILL)
        cluster.scheduler.proc.wait(10)
        time.sleep(0.5)
        cluster.start_scheduler()                  # same address, same journal
        result = job.result(timeout=300)
        assert cluster.client.conn.scheduler_id != old_id
        events = [first, *job.events(timeout=30)]
        keys = [(e.data["candidate_id"], e.data["stage"]) for e in events if e.kind == "verdict"]
        assert len(keys) == len(set(keys)), f"a stage was reported twice: {keys}"
        assert set(keys) == {("slow0", "validate"), ("slow0", "profile"), ("slow1", "validate"),
                             ("slow1", "profile"), ("fast", "validate"), ("fast", "profile"),
                             ("wrong", "validate")}
        assert "resumed" in [e.kind for e in events]
        assert result.status == "succeeded" and result.summary["validated"] == 4
        status = job.status()
        assert status.attempts == 2 and status.updates == 7
    finally:
        cluster.stop()


def test_a_wait_on_a_job_ends_once_the_scheduler_stops_answering(tmp_path: Path, softmax_problem: str) -> None:
    """A stopped (SIGSTOP) scheduler: the job's events end within scheduler_timeout_s with an error
    naming the setting, not never; once it answers again, the job can be followed again."""
    from specgen.runtime.transport import SchedulerUnreachable

    settings = quick_eval_settings(scheduler_timeout_s=2.0)
    with LocalCluster(workers=1, evaluator="replay", settings=settings) as cluster:
        candidates = {f"c{i}": WRONG.replace("2.0", f"2.{i + 1}") for i in range(8)}
        job = cluster.client.submit(softmax_problem, entry=ENTRY, options={"candidates": candidates,
                                                                           "submit_interval_s": 0.5})
        events = job.events(timeout=60)
        next(events)
        os.kill(cluster.scheduler.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(SchedulerUnreachable, match=r"has said nothing for \d+ s \(setting "
                                                           r"scheduler_timeout_s=2\)"):
                for _ in events:
                    pass
            assert time.monotonic() - started < 8
        finally:
            os.kill(cluster.scheduler.pid, signal.SIGCONT)
        assert job.result(timeout=120).status == "succeeded"
