"""SchedulerEvaluationBackend under load: a burst of 1,000 candidates, backpressure, updates once."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

from specgen.backend import BackendLoad, EvaluationBackend
from specgen.messages import CandidateSubmission
from specgen.runtime.local import LocalCluster
from specgen.runtime.replay_evaluator import ReplaySample, directive
from specgen.runtime.settings import RuntimeSettings

PROBLEM = "class Model:\n    pass\n"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def submission(job: str, i: int, sample: ReplaySample) -> CandidateSubmission:
    return CandidateSubmission(job_id=job, candidate_id=f"c{i}", problem_name="burst",
                               problem_source=PROBLEM, candidate_source=directive(sample) + "# " + "x" * 2000,
                               origin="fork", extracted_at=time.time())


def test_a_burst_of_1000_candidates_completes_with_bounded_memory() -> None:
    # Candidates that fail fast (replayed evaluation of 2 ms): the test is about the runtime.
    settings = RuntimeSettings(max_queued_requests=300, max_outstanding_submits=64, peer_timeout_s=10.0)
    with LocalCluster(workers=2, evaluator="replay", settings=settings) as cluster:
        backend = cluster.backend()
        for name in ("submit", "updates", "cancel_job", "load"):     # the EvaluationBackend protocol
            assert callable(getattr(backend, name)) and hasattr(EvaluationBackend, name)
        scheduler_pid = cluster.scheduler.pid
        before = rss_kib(scheduler_pid)

        async def run() -> tuple[list, float]:
            fail_fast = ReplaySample(validate_s=0.002, correct=False)
            profiled = ReplaySample(validate_s=0.002, correct=True, profile_s=0.002, speedup=1.5)
            started = time.monotonic()
            submit = asyncio.gather(*(backend.submit(submission("burst", i, profiled if i % 10 == 0 else fail_fast))
                                      for i in range(1000)))
            seen = []
            wanted = 1000 + 100      # every validation, plus profiling of the 100 correct ones
            async def collect() -> None:
                async for upd in backend.updates():
                    seen.append(upd)
                    if len(seen) == wanted:
                        return
            await asyncio.wait_for(asyncio.gather(submit, collect()), timeout=240)
            return seen, time.monotonic() - started

        seen, seconds = asyncio.run(run())
        keys = [(u.candidate_id, u.stage) for u in seen]
        assert len(keys) == len(set(keys)) == 1100
        assert sum(1 for u in seen if u.stage == "profile") == 100
        assert backend.refused_busy > 0, "the burst should have met the queue limit (backpressure)"
        stats = cluster.client.stats()
        assert stats.validate.queued == stats.profile.queued == 0
        assert stats.requests_done == 1100 and stats.duplicates_ignored == 0
        grown_mib = (rss_kib(scheduler_pid) - before) / 1024
        assert grown_mib < 64, f"scheduler memory grew by {grown_mib:.0f} MiB for 1,000 candidates"
        print(f"1,000 candidates in {seconds:.1f} s; scheduler RSS +{grown_mib:.1f} MiB")


def test_load_snapshot_and_cancel_through_the_backend() -> None:
    with LocalCluster(workers=2, evaluator="replay") as cluster:
        backend = cluster.backend()

        async def run() -> BackendLoad:
            slow = ReplaySample(validate_s=5.0, correct=False)
            for i in range(6):
                await backend.submit(submission("slowjob", i, slow))
            load = await backend.refresh_load()
            await backend.cancel_job("slowjob")
            cancelled = []
            async for upd in backend.updates():
                cancelled.append(upd)
                if len(cancelled) == 6:
                    break
            assert all(u.cancelled for u in cancelled)
            assert backend.load() is not None
            return load

        load = asyncio.run(run())
        assert load.validation_running + load.profiling_running == 2     # both workers busy (one lends)
        assert load.validation_queued == 4
        assert load.validation_workers + load.profiling_workers == 2
