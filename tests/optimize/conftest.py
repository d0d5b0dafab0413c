"""Shared fixtures: real CPU evaluation workers (started once per session) and small traces.

Evaluation runs for real (subprocess runners, Triton under its interpreter, plain PyTorch), with
few trials so that the whole directory stays within its time budget on a 2-core machine.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from specgen.backend import EvaluationBackend
from specgen.eval.evaluator import EvalWorker
from specgen.eval.options import EvalOptions
from specgen.runtime.inprocess import InProcessCluster

DATA = Path(__file__).resolve().parents[2] / "specgen" / "data"
PROBLEMS = DATA / "problems"

# Enough to tell a correct kernel from a wrong one and a slow one from a fast one; fast on CPU.
TEST_EVAL_OPTIONS = EvalOptions(trials=2, timing_trials=5, warmup=1, second_shape=False,
                                randomized_params=False)


@pytest.fixture(scope="session")
def eval_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[EvalWorker]]:
    root = tmp_path_factory.mktemp("optimize-eval")
    workers = [EvalWorker(device="cpu", work_dir=root / f"worker{i}", options=TEST_EVAL_OPTIONS,
                          name=f"test/cpu{i}") for i in range(2)]
    for worker in workers:
        worker.start()
    try:
        yield workers
    finally:
        for worker in workers:
            worker.close()


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    """The tiny random-weight Qwen2 and its tokenizer, built locally once and cached."""
    from specgen.engines.tiny_model import build_tiny_model, default_tiny_model_dir

    return build_tiny_model(default_tiny_model_dir())


@contextlib.asynccontextmanager
async def local_backend(workers: list[EvalWorker]) -> AsyncIterator[EvaluationBackend]:
    """A backend over the session's workers, through a scheduler core in this process (bound to
    the running loop): what a job's loop gets in every cluster."""
    async with InProcessCluster(evaluators=workers) as cluster:
        yield cluster.backend()


def run(coro):
    return asyncio.run(coro)
