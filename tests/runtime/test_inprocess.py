"""The in-process cluster: the scheduler's core, workers and reasoners in one process, driven as a
cluster over sockets is (validate then profile, cancels, job deadlines, dead workers, resume)."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from specgen.backend import EvaluationBackend
from specgen.messages import CandidateSubmission, CandidateUpdate, JobSpec, Verdict
from specgen.runtime.inprocess import InProcessCluster
from specgen.runtime.replay_evaluator import ReplayEvaluator, ReplaySample, directive
from specgen.runtime.settings import RuntimeSettings

ENTRY = "specgen.runtime.jobs:evaluate_candidates"
PROBLEM = "class Model:\n    pass\n"
FAST = directive(ReplaySample(validate_s=0.01, correct=True, profile_s=0.01, speedup=5.0))
MEH = directive(ReplaySample(validate_s=0.01, correct=True, profile_s=0.01, speedup=1.1))
WRONG = directive(ReplaySample(validate_s=0.01, correct=False, profile_s=0.01, speedup=1.0))
SLOW = directive(ReplaySample(validate_s=30.0, correct=True, profile_s=0.01, speedup=9.0))


def replaying(count: int) -> list[ReplayEvaluator]:
    evaluators = []
    for i in range(count):
        evaluator = ReplayEvaluator.from_spec("replay")
        evaluator.name = f"test/replay{i}"
        evaluators.append(evaluator)
    return evaluators


def sub(cid: str, source: str, job_id: str = "j1") -> CandidateSubmission:
    return CandidateSubmission(job_id=job_id, candidate_id=cid, problem_name="p", problem_source=PROBLEM,
                               candidate_source=source, origin="final", extracted_at=time.time())


async def collect(backend: EvaluationBackend, count: int, timeout: float = 60) -> list[CandidateUpdate]:
    updates: list[CandidateUpdate] = []

    async def read() -> None:
        async for update in backend.updates():
            updates.append(update)
            if len(updates) == count:
                return

    await asyncio.wait_for(read(), timeout)
    return updates


def test_backend_validates_then_profiles_the_correct_ones() -> None:
    async def scenario() -> tuple[list[CandidateUpdate], int]:
        async with InProcessCluster(evaluators=replaying(2)) as cluster:
            backend = cluster.backend()
            await backend.submit(sub("good", FAST))
            await backend.submit(sub("wrong", WRONG))
            updates = await collect(backend, 3)
            load = await backend.refresh_load()
            return updates, load.validation_workers + load.profiling_workers

    updates, workers = asyncio.run(scenario())
    stages = [(u.candidate_id, u.stage) for u in updates]
    assert stages.index(("good", "validate")) < stages.index(("good", "profile"))
    assert ("wrong", "profile") not in stages
    by_key = {(u.candidate_id, u.stage): u for u in updates}
    assert by_key[("good", "profile")].verdict.speedup == 5.0
    assert by_key[("good", "validate")].worker.startswith("test/replay")
    assert workers == 2


def test_a_job_runs_its_entry_here_and_its_client_follows_it() -> None:
    with InProcessCluster(evaluators=replaying(2)) as cluster:
        job = cluster.client.submit(PROBLEM, entry=ENTRY, options={
            "candidates": {"meh": MEH, "fast": FAST, "slow1": SLOW, "slow2": SLOW}, "target_speedup": 3.0})
        result = job.result(timeout=60)
        events = list(job.events(timeout=10))
    assert result.status == "succeeded" and result.best_candidate_id == "fast"
    cancelled = {e.data["candidate_id"] for e in events if e.kind == "verdict" and e.data["cancelled"]}
    assert {"slow1", "slow2"} <= cancelled
    assert [e.seq for e in events] == sorted({e.seq for e in events})   # in order, none twice
    assert events[-1].kind == "finished"


def test_the_core_ends_a_job_past_its_wall_time() -> None:
    """One enforcer of a job's wall time, as over sockets: the scheduler core's deadline (plus the
    setting job_grace_s) stops the reasoner and drops its evaluations."""
    settings = RuntimeSettings(job_grace_s=0.2)
    with InProcessCluster(evaluators=replaying(1), settings=settings) as cluster:
        began = time.monotonic()
        job = cluster.client.submit(PROBLEM, entry=ENTRY, wall_time_s=0.5,
                                    options={"candidates": {"slow": SLOW}})
        result = job.result(timeout=30)
        took = time.monotonic() - began
    assert result.status == "timed_out" and took < 10
    assert "wall time" in (result.error or "")


def test_a_cancelled_job_stops_its_reasoner_and_evaluations() -> None:
    with InProcessCluster(evaluators=replaying(1)) as cluster:
        job = cluster.client.submit(PROBLEM, entry=ENTRY, options={"candidates": {"slow": SLOW}})
        for event in job.events(timeout=30):
            if event.kind == "submitted":
                break
        job.cancel()
        result = job.result(timeout=30)
    assert result.status == "cancelled"


class _Broken:
    """An evaluator whose device fails: the worker dies with its request."""

    name, device = "test/broken", "cpu"

    def start(self) -> None: ...
    def cancel(self, run_id: str | None = None) -> None: ...
    def close(self) -> None: ...

    def run(self, submission: CandidateSubmission, stage: str = "full", run_id: str | None = None) -> Verdict:
        raise RuntimeError("device lost")


@pytest.mark.parametrize("restarts", [0, 2])
def test_a_dead_workers_request_runs_on_another(restarts: int) -> None:
    """A worker whose evaluator raised dies, as its process would: its request goes back to the
    queue; it registers again at most cluster_max_restarts times, then the cluster says so."""
    async def scenario() -> tuple[list[CandidateUpdate], str | None]:
        healthy = replaying(1)[0]
        settings = RuntimeSettings(cluster_max_restarts=restarts, max_request_attempts=restarts + 2)
        async with InProcessCluster(evaluators=[_Broken(), healthy], settings=settings) as cluster:
            backend = cluster.backend()
            for i in range(2 * restarts + 3):
                await backend.submit(sub(f"c{i}", WRONG))
            updates = await collect(backend, 2 * restarts + 3)
            return updates, cluster.failure

    updates, failure = asyncio.run(scenario())
    assert sorted(u.candidate_id for u in updates) == sorted(f"c{i}" for i in range(2 * restarts + 3))
    assert {u.worker for u in updates} == {"test/replay0"} and not any(u.cancelled for u in updates)
    assert failure is not None and "test/broken" in failure and "device lost" in failure


RESUMABLE = "tests.runtime.test_inprocess:count_starts"


async def count_starts(spec: JobSpec, backend: EvaluationBackend, emit, run_dir: Path):  # noqa: ANN001
    """A job that journals its starts in its folder and ends on its second."""
    marks = run_dir / "starts"
    starts = int(marks.read_text()) + 1 if marks.exists() else 1
    marks.write_text(str(starts))
    if starts == 1:
        await asyncio.sleep(600)
    return {"starts": starts}


def test_a_job_stopped_with_its_cluster_resumes_from_the_same_state(tmp_path: Path) -> None:
    state = tmp_path / "state"
    settings = RuntimeSettings(job_entries=[*RuntimeSettings().job_entries, RESUMABLE])
    with InProcessCluster(evaluators=replaying(1), state_dir=state, settings=settings) as cluster:
        job = cluster.client.submit(PROBLEM, entry=RESUMABLE, job_id="resumable-job")
        deadline = time.monotonic() + 20
        while not (state / "jobs" / "resumable-job" / "starts").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert not job.done()
    assert (state / "journal.sqlite3").exists() and oct(state.stat().st_mode & 0o777) == "0o700"
    with InProcessCluster(evaluators=replaying(1), state_dir=state, settings=settings) as cluster:
        result = cluster.client.job("resumable-job").result(timeout=30)
    assert result.status == "succeeded" and result.summary == {"starts": 2}


def test_a_blocking_request_from_the_loop_thread_is_refused() -> None:
    async def scenario() -> None:
        async with InProcessCluster(evaluators=replaying(1)) as cluster:
            with pytest.raises(RuntimeError, match="asyncio.to_thread"):
                cluster.client.stats()
            assert (await asyncio.to_thread(cluster.client.stats)).workers

    asyncio.run(scenario())


def test_needs_devices_or_evaluators() -> None:
    with pytest.raises(ValueError, match="devices or evaluators"):
        InProcessCluster()
