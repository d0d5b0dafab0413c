"""Shared fixtures for the evaluation service's tests: one CPU worker (with a spare runner) for
the whole session, the bundled and test problems, and helpers to submit candidates."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from specgen.eval import EvalOptions, EvalWorker
from specgen.messages import CandidateSubmission, Verdict
from tests.eval.expectations import codes, header  # noqa: F401 - re-exported for the tests

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "specgen" / "data" / "problems"
HERE = Path(__file__).resolve().parent
TEST_PROBLEMS = HERE / "problems"
CORPUS = HERE / "corpus"

# Few timed calls (the calls of nothing stay at their default: the resolution is their spread,
# which a handful of them does not estimate): CPU timings here only need to exist.
FAST = EvalOptions(timing_trials=8, warmup=1, timeout_s=120.0)


def problem_path(name: str, candidate: Path | None = None) -> Path:
    """The problem `name`; a corpus candidate's problem is the corpus's (names overlap)."""
    folders = [BUNDLED, TEST_PROBLEMS, CORPUS / "problems"]
    if candidate is not None and CORPUS in candidate.resolve().parents:
        folders.insert(0, CORPUS / "problems")
    for folder in folders:
        path = folder / f"{name}.py"
        if path.is_file():
            return path
    raise FileNotFoundError(name)


def submission(problem: str, candidate_source: str, candidate_id: str | None = None,
               job_id: str = "test", candidate: Path | None = None) -> CandidateSubmission:
    return CandidateSubmission(job_id=job_id, candidate_id=candidate_id or uuid.uuid4().hex[:8],
                               problem_name=problem,
                               problem_source=problem_path(problem, candidate).read_text(),
                               candidate_source=candidate_source)


def candidate_submission(path: Path) -> CandidateSubmission:
    """A test candidate file with the problem its header (or, bundled, its name) says."""
    problem = header(path, "problem") or path.stem.rsplit("_", 1)[0]
    return submission(problem, path.read_text(), path.stem, candidate=path)


def concealed(code: str) -> str:
    """`code` as one expression no reader of the source would spot (hex-encoded `exec`), as an
    attacker would hide it: for tests of what happens once such code runs."""
    return f"exec(bytes.fromhex({code.encode().hex()!r}).decode())"


@pytest.fixture(scope="session")
def eval_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("eval-cache")


@pytest.fixture(scope="session")
def cpu_worker(tmp_path_factory: pytest.TempPathFactory, eval_cache: Path) -> EvalWorker:
    options = EvalOptions(timing_trials=8, warmup=1, timeout_s=120.0,
                          cache_dir=str(eval_cache))
    worker = EvalWorker("cpu", tmp_path_factory.mktemp("cpu-worker"), spare_processes=1,
                        options=options)
    worker.start()
    yield worker
    worker.close()


def verdict_summary(verdict: Verdict) -> str:
    return (f"correct={verdict.correct} flags={verdict.flags} error={verdict.error} "
            f"speedup={verdict.speedup}")
