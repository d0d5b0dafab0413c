"""LocalEvaluationBackend: validate then profile, completion order, cancel, deadlines, load."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from specgen.eval import EvalOptions, EvalWorker
from specgen.eval.local_backend import LocalEvaluationBackend
from specgen.messages import CandidateUpdate
from specgen.backend import EvaluationBackend
from tests.eval.conftest import BUNDLED, submission

GOOD = (BUNDLED / "candidates" / "softmax_torch.py").read_text()
WRONG = GOOD.replace("return shifted.div_(", "return shifted.mul_(")
HANG = ("import time, torch\nclass ModelNew(torch.nn.Module):\n"
        "    def forward(self, x):\n        time.sleep(600)\n")


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> list[EvalWorker]:
    cache = tmp_path_factory.mktemp("backend-cache")
    options = EvalOptions(timing_trials=4, warmup=1, timeout_s=120, cache_dir=str(cache))
    pool = [EvalWorker("cpu", tmp_path_factory.mktemp(f"backend-{i}"), spare_processes=1,
                       options=options, name=f"test/cpu{i}") for i in range(2)]
    for worker in pool:
        worker.start()
    yield pool
    for worker in pool:
        worker.close()


async def collect(backend: LocalEvaluationBackend, count: int, timeout: float = 120
                  ) -> list[CandidateUpdate]:
    updates: list[CandidateUpdate] = []

    async def read() -> None:
        async for update in backend.updates():
            updates.append(update)
            if len(updates) == count:
                return

    await asyncio.wait_for(read(), timeout)
    return updates


def test_validate_then_profile_in_completion_order(workers: list[EvalWorker]) -> None:
    async def scenario() -> list[CandidateUpdate]:
        backend = LocalEvaluationBackend(workers)
        protocol: EvaluationBackend = backend
        for method in ("submit", "updates", "cancel_job", "load"):
            assert callable(getattr(protocol, method))
        await backend.submit(submission("softmax", GOOD, "good", job_id="j1"))
        await backend.submit(submission("softmax", WRONG, "wrong", job_id="j1"))
        load = backend.load()
        assert load.validation_workers == 2 and load.validation_queued + \
            load.validation_running == 2
        updates = await collect(backend, 3)
        await backend.close()
        return updates

    updates = asyncio.run(scenario())
    stages = [(u.candidate_id, u.stage) for u in updates]
    assert stages.index(("good", "validate")) < stages.index(("good", "profile"))
    assert ("wrong", "profile") not in stages
    by_key = {(u.candidate_id, u.stage): u for u in updates}
    assert by_key[("good", "validate")].verdict.correct
    assert not by_key[("wrong", "validate")].verdict.correct
    profile = by_key[("good", "profile")]
    assert profile.verdict.speedup and profile.worker.startswith("test/cpu")
    assert all(u.finished_at >= u.started_at > 0 for u in updates)
    finished = [u.finished_at for u in updates]
    assert finished == sorted(finished)


def test_cancel_job_drops_queued_and_stops_running(workers: list[EvalWorker]) -> None:
    async def scenario() -> tuple[list[CandidateUpdate], float]:
        backend = LocalEvaluationBackend(workers)
        for name in ("hang-a", "hang-b", "queued-1", "queued-2"):
            await backend.submit(submission("softmax", HANG if name.startswith("hang") else GOOD,
                                            name, job_id="j2"))
        await backend.submit(submission("softmax", GOOD, "other-job", job_id="j3"))
        while backend.load().validation_running < 2:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        began = time.monotonic()
        await backend.cancel_job("j2")
        updates = await collect(backend, 6)
        took = time.monotonic() - began
        await backend.close()
        return updates, took

    updates, took = asyncio.run(scenario())
    by_id = {}
    for update in updates:
        by_id.setdefault(update.candidate_id, []).append(update)
    assert took < 60
    for name in ("hang-a", "hang-b", "queued-1", "queued-2"):
        assert len(by_id[name]) == 1 and by_id[name][0].cancelled, by_id[name]
    assert by_id["hang-a"][0].verdict.error == "cancelled" and by_id["hang-a"][0].verdict.code == "cancelled"
    assert by_id["queued-1"][0].verdict.error == "cancelled: job cancelled"
    other = {u.stage: u for u in by_id["other-job"]}
    assert other["validate"].verdict.correct and not other["validate"].cancelled


def test_expired_deadline_is_dropped(workers: list[EvalWorker]) -> None:
    async def scenario() -> list[CandidateUpdate]:
        backend = LocalEvaluationBackend(workers)
        late = submission("softmax", GOOD, "late", job_id="j4")
        late = late.__class__(**{**{f: getattr(late, f) for f in late.__struct_fields__},
                                 "deadline": time.time() - 1})
        await backend.submit(late)
        updates = await collect(backend, 1)
        await backend.close()
        return updates

    (update,) = asyncio.run(scenario())
    assert update.cancelled and update.verdict.error == "cancelled: deadline passed"


def test_needs_workers() -> None:
    with pytest.raises(ValueError, match="at least one EvalWorker"):
        LocalEvaluationBackend([])


def test_close_leaves_workers_usable(workers: list[EvalWorker], tmp_path: Path) -> None:
    assert workers[0].run(submission("softmax", GOOD), "validate").correct
