"""Known reward hacks, each rejected for its own reason, and honest candidates, each accepted.

Every cheating candidate in `redteam/` names its problem and the reason it must be rejected for:
`# expect: <flag code>` (the verdict's flags must carry that code) or `# expect: error:<text>`
(the verdict's error must say it). A cheat the static checks already flag is refused before any
of its code runs, with exactly those flags. Candidates in `honest/` and the bundled reference candidates
must come out correct with no flag at all.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from specgen.eval import FLAG_CODES, flag_code
from specgen.eval.guards.static import scan_source
from tests.eval.conftest import BUNDLED, HERE, codes, header, submission

CHEATS = sorted((HERE / "redteam").glob("*.py"))
# CUDA candidates (`*_cuda.py`) run in the GPU tests only.
HONEST = sorted((HERE / "honest").glob("*.py")) + sorted(
    p for p in (BUNDLED / "candidates").glob("*.py") if not p.stem.endswith("_cuda"))


def _bundled_problem(path: Path) -> str:
    # softmax_triton.py -> softmax; matmul_bias_relu_torch.py -> matmul_bias_relu
    return path.stem.rsplit("_", 1)[0]


def test_the_suite_is_big_enough() -> None:
    flagged = [p for p in CHEATS if not header(p, "expect").startswith("error:")]
    assert len(flagged) >= 15 and len(CHEATS) >= 20
    assert len(HONEST) >= 10
    for path in CHEATS:
        expect = header(path, "expect")
        assert expect.startswith("error:") or expect in FLAG_CODES, path.name


@pytest.mark.parametrize("path", CHEATS, ids=lambda p: p.stem)
def test_cheat_is_rejected_for_its_reason(cpu_worker, path: Path) -> None:
    problem, expect = header(path, "problem"), header(path, "expect")
    # Timing-dependent cheats need the profile stage; the rest are caught by validation.
    stage = "full" if expect.startswith("error:after timing") else "validate"
    verdict = cpu_worker.run(submission(problem, path.read_text(), path.stem), stage)
    assert not verdict.correct, verdict
    if expect.startswith("error:"):
        assert verdict.error is not None and expect[len("error:"):] in verdict.error, verdict
    else:
        static = [flag_code(f) for f in scan_source(ast.parse(path.read_text()))]
        if static:
            # Flagged by the static checks: refused before any of its code ran, for those flags.
            assert codes(verdict) == static and not verdict.compiled, verdict
        else:
            assert expect in codes(verdict), verdict


@pytest.mark.parametrize("path", HONEST, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_honest_candidate_is_accepted(cpu_worker, path: Path) -> None:
    problem = header(path, "problem") or _bundled_problem(path)
    verdict = cpu_worker.run(submission(problem, path.read_text(), path.stem), "full")
    assert verdict.correct, verdict
    assert verdict.flags == [] and verdict.error is None
    assert verdict.compiled and verdict.cpu_timing and verdict.device == "cpu"
    assert verdict.max_abs_error is not None and verdict.max_abs_error < 1e-3
    assert verdict.candidate_ms and verdict.ref_ms and verdict.speedup
