"""The worker actor's request handling (no scheduler needed: its connection is never started)."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from specgen.messages import AssignWork, CancelWork, CandidateSubmission
from specgen.runtime.replay_evaluator import ReplayEvaluator, ReplaySample, directive
from specgen.runtime.settings import RuntimeSettings
from specgen.runtime.worker import WorkerActor, WorkerConfig, build_evaluator

import pytest


def make_actor(tmp_path: Path) -> WorkerActor:
    config = WorkerConfig(name="n/cpu0", node="n", device="cpu", scheduler=f"ipc://{tmp_path}/none.sock",
                          work_dir=str(tmp_path / "work"), evaluator="replay")
    actor = WorkerActor(config, RuntimeSettings())
    actor.evaluator = ReplayEvaluator()
    return actor


def task(request_id: str, seconds: float, stage: str = "validate") -> AssignWork:
    sub = CandidateSubmission(job_id="j", candidate_id=request_id, problem_name="p", problem_source="",
                              candidate_source=directive(ReplaySample(validate_s=seconds, correct=True)))
    return AssignWork(request_id=request_id, stage=stage, submission=sub)


def test_runs_a_request_and_reports_who_and_when(tmp_path: Path) -> None:
    actor = make_actor(tmp_path)
    try:
        upd = actor.run_one(task("r1", 0.01))
        assert upd.verdict.correct and upd.worker == "n/cpu0" and not upd.cancelled
        assert upd.finished_at >= upd.started_at > 0
    finally:
        actor.close()


def test_cancel_work_stops_the_running_request_or_skips_a_queued_one(tmp_path: Path) -> None:
    actor = make_actor(tmp_path)
    try:
        result = {}
        runner = threading.Thread(target=lambda: result.setdefault("u", actor.run_one(task("r2", 30.0))))
        runner.start()
        time.sleep(0.2)
        assert actor._busy_fields()["busy_key"] == ["j", "r2", "validate"]
        actor._on_message(CancelWork(request_id="r2"))
        runner.join(5)
        assert result["u"].cancelled
        actor._on_message(CancelWork(request_id="r3"))      # not started yet
        assert actor.run_one(task("r3", 30.0)).verdict.error == "cancelled before it started"
    finally:
        actor.close()


def test_unknown_evaluator_is_refused(tmp_path: Path) -> None:
    config = WorkerConfig(name="n/cpu0", node="n", device="cpu", scheduler="ipc:///x",
                          work_dir=str(tmp_path), evaluator="magic")
    with pytest.raises(ValueError, match="unknown evaluator"):
        build_evaluator(config, RuntimeSettings())


def test_hello_lists_the_results_kept_until_acknowledged(tmp_path: Path) -> None:
    from specgen.messages import CandidateUpdate, Verdict, WorkDone

    actor = make_actor(tmp_path)
    try:
        assert "held_results" not in actor._busy_fields()
        for rid in ("s1-1", "s1-2"):
            upd = CandidateUpdate(job_id="j", candidate_id=rid, stage="validate", verdict=Verdict())
            actor.conn.send_kept(WorkDone(request_id=rid, update=upd))
        assert actor._busy_fields()["held_results"] == ["s1-1", "s1-2"]
        # Acknowledged (as the scheduler's next AssignWork or HeartbeatAck does): no longer held.
        first = next(iter(actor.conn.calls.pending))
        actor.conn.calls.acks_due.append(first)
        actor.conn.calls.apply_acks()
        assert actor._busy_fields()["held_results"] == ["s1-2"]
    finally:
        actor.close()


def test_the_request_in_flight_is_marked_for_the_node(tmp_path: Path) -> None:
    """While a request runs its worker marks it in its work directory; a worker that dies with
    the mark there died judging that candidate (runtime/node.py does not count such deaths)."""
    from specgen.runtime.worker import IN_FLIGHT, in_flight

    actor = make_actor(tmp_path)
    work = tmp_path / "work"
    try:
        result = {}
        runner = threading.Thread(target=lambda: result.setdefault("u", actor.run_one(task("r4", 1.0))))
        runner.start()
        time.sleep(0.3)
        assert json.loads((work / IN_FLIGHT).read_text())["request_id"] == "r4"
        runner.join(10)
        assert result["u"].verdict.correct and not (work / IN_FLIGHT).exists()

        def raising(*args, **kwargs):
            raise OverflowError("from the evaluation")

        actor.evaluator.run = raising            # an exception that ends the worker's process
        for request_id in ("r5", "r6"):
            with pytest.raises(OverflowError):
                actor.run_one(task(request_id, 0.01))
            assert (work / IN_FLIGHT).exists()   # left for the node
        assert in_flight(work, os.getpid()) == "j/r6 validate"
        assert not (work / IN_FLIGHT).exists()   # read once: a restarted worker starts clean
        with pytest.raises(OverflowError):
            actor.run_one(task("r7", 0.01))
        assert in_flight(work, os.getpid() + 1) is None    # another process's mark: not its death
    finally:
        actor.close()
