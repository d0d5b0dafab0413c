"""Known reward hacks and honest kernels, each judged as its header says (tests/eval/expectations.py).

`redteam/` holds hacks written against this evaluator's earlier designs (a forged result frame, a
clock swapped only while timed, a thread filling the output after return, outputs memoized by
sampled values, ...); `corpus/` is a corpus of public-style problems with honest and cheating
candidates; `honest/` and the bundled library's honest candidates must be accepted. Files marked
`# device: cuda` run in the GPU tests only.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from specgen.eval import FLAG_CODES
from tests.eval.conftest import (BUNDLED, CORPUS, HERE, candidate_submission, header,
                                 verdict_summary)
from tests.eval.expectations import meets


def _runs_on_cpu(path: Path) -> bool:
    return header(path, "device") in (None, "cpu", "any") and not path.stem.endswith("_cuda")


def _by_problem(paths: list[Path]) -> list[Path]:
    # Candidates of one problem one after another: the worker keeps that problem's reference.
    return sorted(paths, key=lambda p: (candidate_submission(p).problem_source, p.name))


CHEATS = _by_problem([p for p in (*(HERE / "redteam").glob("*.py"), *(CORPUS / "cheat").glob("*.py"))
                      if _runs_on_cpu(p)])
HONEST = _by_problem([p for p in (*(HERE / "honest").glob("*.py"), *(CORPUS / "honest").glob("*.py"),
                                  *(BUNDLED / "candidates").glob("*.py")) if _runs_on_cpu(p)])


def test_the_suite_is_big_enough_and_well_formed() -> None:
    assert len(CHEATS) >= 50 and len(HONEST) >= 50
    for path in CHEATS:
        expect = header(path, "expect") or ""
        assert (expect in ("reject",) or expect.startswith(("error:", "honest-speed "))
                or expect in FLAG_CODES), f"{path.name}: # expect: {expect}"


@pytest.mark.parametrize("path", CHEATS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_cheat_gets_no_forged_or_inflated_verdict(cpu_worker, path: Path) -> None:
    verdict = cpu_worker.run(candidate_submission(path), "full")
    ok, why = meets(verdict, header(path, "expect") or "reject")
    assert ok, f"{why}: {verdict_summary(verdict)}"


@pytest.mark.parametrize("path", HONEST, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_honest_candidate_is_accepted(cpu_worker, path: Path) -> None:
    verdict = cpu_worker.run(candidate_submission(path), "full")
    assert verdict.correct and verdict.flags == [] and verdict.error is None, \
        verdict_summary(verdict)
    assert verdict.compiled and verdict.cpu_timing and verdict.device == "cpu"
    assert verdict.max_abs_error is not None
    assert verdict.candidate_ms and verdict.ref_ms and verdict.speedup
