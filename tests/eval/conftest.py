"""Shared fixtures for the evaluation service's tests: one CPU worker (with spare runners) for the
whole session, the bundled problems, and helpers to submit candidates."""
from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from specgen.eval import EvalOptions, EvalWorker
from specgen.messages import CandidateSubmission, Verdict

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "specgen" / "data" / "problems"
HERE = Path(__file__).resolve().parent
TEST_PROBLEMS = HERE / "problems"

# Few timed calls: CPU timings here only need to exist, not to be precise.
FAST = EvalOptions(timing_trials=4, warmup=1, timeout_s=120.0)


def problem_path(name: str) -> Path:
    for folder in (BUNDLED, TEST_PROBLEMS):
        path = folder / f"{name}.py"
        if path.is_file():
            return path
    raise FileNotFoundError(name)


def header(path: Path, key: str) -> str | None:
    """`# key: value` from a candidate file's first lines."""
    match = re.search(rf"^# {key}: (.+)$", path.read_text(), flags=re.MULTILINE)
    return match.group(1).strip() if match else None


def submission(problem: str, candidate_source: str, candidate_id: str | None = None,
               job_id: str = "test") -> CandidateSubmission:
    return CandidateSubmission(job_id=job_id, candidate_id=candidate_id or uuid.uuid4().hex[:8],
                               problem_name=problem,
                               problem_source=problem_path(problem).read_text(),
                               candidate_source=candidate_source)


def concealed(code: str) -> str:
    """`code` as one expression the static checks cannot read (hex-encoded `exec`), as an
    attacker would hide it: for tests of what happens once such code runs."""
    return f"exec(bytes.fromhex({code.encode().hex()!r}).decode())"


def codes(verdict: Verdict) -> list[str]:
    return [flag.split(":", 1)[0] for flag in verdict.flags]


@pytest.fixture(scope="session")
def eval_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("eval-cache")


@pytest.fixture(scope="session")
def cpu_worker(tmp_path_factory: pytest.TempPathFactory, eval_cache: Path) -> EvalWorker:
    options = EvalOptions(timing_trials=4, warmup=1, timeout_s=120.0, cache_dir=str(eval_cache))
    worker = EvalWorker("cpu", tmp_path_factory.mktemp("cpu-worker"), spare_processes=2,
                        options=options)
    worker.start()
    yield worker
    worker.close()
