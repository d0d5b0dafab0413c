"""`specgen eval`: JSON verdicts, exit 0 for failing candidates, one line and exit 2 for bad input."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specgen.cli import main
from tests.eval.conftest import BUNDLED, HERE

SOFTMAX = str(BUNDLED / "softmax.py")
GOOD = str(BUNDLED / "candidates" / "softmax_torch.py")
FAST = ["--trials", "2", "--timing-trials", "3"]


def test_json_verdict_has_the_documented_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", SOFTMAX, GOOD, "--device", "cpu", "--json", *FAST]) == 0
    verdict = json.loads(capsys.readouterr().out)
    for key in ("compiled", "correct", "max_abs_error", "max_rel_error", "ref_ms",
                "candidate_ms", "speedup", "device", "flags", "error"):
        assert key in verdict
    assert verdict["correct"] and verdict["flags"] == [] and verdict["error"] is None
    assert verdict["device"] == "cpu" and verdict["cpu_timing"] is True
    assert verdict["speedup"] == pytest.approx(verdict["ref_ms"] / verdict["candidate_ms"])


def test_a_rejected_candidate_exits_0_with_its_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    cheat = str(HERE / "redteam" / "zeroes_inputs.py")
    assert main(["eval", SOFTMAX, cheat, "--device", "cpu", "--json", *FAST]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert not verdict["correct"] and verdict["flags"][0].startswith("mutated-inputs:")
    assert main(["eval", SOFTMAX, cheat, "--device", "cpu", *FAST]) == 0
    text = capsys.readouterr().out
    assert text.startswith("rejected on cpu") and "flag: mutated-inputs" in text


@pytest.mark.parametrize("args, message", [
    ([SOFTMAX, "/no/such/candidate.py"], "candidate file not found: /no/such/candidate.py"),
    (["/no/such/problem.py", GOOD], "problem file not found: /no/such/problem.py"),
    ([str(BUNDLED / "matmul_bias_relu.py"), GOOD], "ModelNew.__init__ takes 0 arguments"),
    ([SOFTMAX, GOOD, "--device", "gpu"], "--device must be cpu or cuda:N, got 'gpu'"),
    ([SOFTMAX, GOOD, "--trials", "0"], "--trials must be at least 1"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_syntax_error_through_the_installed_command(tmp_path: Path) -> None:
    broken = tmp_path / "cand.py"
    broken.write_text("import torch\nclass ModelNew(torch.nn.Module:\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "specgen.cli", "eval", SOFTMAX, str(broken)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"specgen eval: error: candidate {broken}: syntax error at "
                                  "line 2: ")
    assert done.stderr.count("\n") == 1
