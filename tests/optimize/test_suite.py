"""`specgen optimize` over several problems: a suite, on the CPU, replaying the bundled traces.

The two bundled problems with hand-written traces (fused_elementwise, matmul_bias_relu) run in
two modes through a local cluster, replayed 12x faster than the timing model and one iteration
each, with few evaluation trials: what tests/cli/test_optimize.py runs for one problem.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specgen.cli import main
from specgen.errors import UsageError
from specgen.optimize.suite import JOURNAL_FILE, SuiteJournal, SuitePlan, discover

from tests.optimize.conftest import PROBLEMS

FAST = ["--speed", "12", "--max-iterations", "1", "--trials", "2", "--timing-trials", "5",
        "--devices", "cpu"]
NAMES = ("fused_elementwise", "matmul_bias_relu")


def _folder(tmp_path: Path, with_helper: bool = True) -> Path:
    folder = tmp_path / "level1"
    folder.mkdir()
    for name in NAMES:
        shutil.copy(PROBLEMS / f"{name}.py", folder / f"{name}.py")
    if with_helper:
        (folder / "utils.py").write_text("def helper():\n    return 1\n")
    return folder


def _journal(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / JOURNAL_FILE).read_text().splitlines()]


# ---------------------------------------------------------------------------------- discovery


def test_a_folder_skips_what_is_no_problem_and_a_named_file_is_refused(tmp_path) -> None:
    folder = _folder(tmp_path)
    found = discover([str(folder)])
    assert [p.name for p in found.problems] == list(NAMES)
    assert len(found.skipped) == 1 and "utils.py" in found.skipped[0] and "Model" in found.skipped[0]
    with pytest.raises(UsageError, match="utils.py is not a KernelBench problem"):
        discover([str(folder / "fused_elementwise.py"), str(folder / "utils.py")])
    assert [p.name for p in discover([str(folder / "*_*.py")]).problems] == list(NAMES)
    with pytest.raises(UsageError, match="matches no file"):
        discover([str(folder / "nothing*.py")])


def test_a_torn_last_line_is_an_unfinished_job(tmp_path) -> None:
    journal = SuiteJournal(tmp_path)
    journal.add({"problem": "a", "mode": "specgen", "repeat": 0, "status": "iterations_done"})
    journal.close()
    with open(tmp_path / JOURNAL_FILE, "ab") as f:
        f.write(b'{"problem": "b", "mode": "spec')
    assert list(SuiteJournal.read(tmp_path)) == ["a/specgen/r0"]


def test_problems_that_have_no_trace_to_replay_are_named(tmp_path, capsys) -> None:
    folder = _folder(tmp_path, with_helper=False)
    shutil.copy(PROBLEMS / "softmax.py", folder / "softmax.py")
    code = main(["optimize", str(folder), *FAST, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "nothing to replay for problem(s) softmax" in err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------- end to end


def test_a_suite_of_two_problems_in_two_modes(tmp_path, capsys, monkeypatch) -> None:
    from specgen.cli import suite
    from specgen.optimize.bench_problems import problems_from_traces

    monkeypatch.setattr(suite, "RECORD_REPLAYS", True)   # the recording path without a live model
    folder = _folder(tmp_path)
    out = tmp_path / "out"
    argv = ["optimize", str(folder), "--modes", "specgen,sequential", "--concurrency", "2", *FAST,
            "--out", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "Skipped (not a KernelBench problem)" in captured.err and "utils.py" in captured.err
    assert "| fast_0 | fast_1 | fast_1.5 | fast_2 |" in captured.out
    assert "specgen / sequential, end-to-end time" in captured.out

    rows = _journal(out)
    assert sorted((r["problem"], r["mode"]) for r in rows) == sorted(
        (n, m) for n in NAMES for m in ("specgen", "sequential"))
    results = json.loads((out / "results.json").read_text())
    assert results["complete"]
    for name in NAMES:
        for mode in ("specgen", "sequential"):
            cell = results["per_problem"][name][mode]
            assert cell["end_to_end_s"] > 0 and cell["tokens"] > 0 and cell["iterations"] == 1
            if cell["correct"]:
                assert (out / cell["best_kernel"]).read_text().count("ModelNew")
    for mode in ("specgen", "sequential"):
        fast = results["per_mode"][mode]["fast_p"]
        assert set(fast) == {"0", "1", "1.5", "2"} and fast["0"] >= fast["1"] >= fast["1.5"] >= fast["2"]
    [ratio] = results["mode_ratios"]
    assert ratio["modes"] == ["specgen", "sequential"] and ratio["pairs"] == 2
    assert ratio["low"] <= ratio["geomean"] <= ratio["high"]
    report = (out / "report.md").read_text()
    assert report.startswith("# Suite: 2 problem(s)")
    # How it ran, as it was: the engine and its pace, the jobs' cluster.
    assert "Ran: replayed bundled traces at 12x their pace" in report and "2 at once" in report
    assert all((out / p).is_file() for p in results["plots"])
    # Each job's turns, recorded, replay as a bench's entries (the problem beside the trace).
    traces = sorted((out / "traces" / "sequential").glob("*.trace.json"))
    assert [t.name for t in traces] == [f"{n}.trace.json" for n in NAMES]
    entries = problems_from_traces(traces)
    assert [e.name for e in entries] == list(NAMES)
    assert all(e.trace.iterations[0].final.num_tokens > 0 for e in entries)

    # Resumed with the same command: nothing runs again, the report is the same suite's.
    assert main(argv + ["--resume"]) == 0
    assert "4 finished before, 0 to run" in capsys.readouterr().err
    assert _journal(out) == rows
    # Resumed with other settings: refused, naming what changed; nothing written.
    code = main(["optimize", str(folder), "--modes", "specgen,pipeline", *FAST[:-4], "--trials", "3",
                 "--timing-trials", "5", "--devices", "cpu", "--out", str(out), "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and "not the one saved there" in err
    assert "modes specgen,pipeline (saved: specgen,sequential)" in err and "trials 3 (saved: 2)" in err
    assert _journal(out) == rows


def test_a_suite_killed_mid_way_resumes_without_redoing_a_finished_job(tmp_path, capsys) -> None:
    folder = _folder(tmp_path, with_helper=False)
    out = tmp_path / "out"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    argv = ["optimize", str(folder), "--modes", "sequential", "--repeats", "2", *FAST, "--quiet",
            "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "specgen.cli", *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 180
        while not ((out / JOURNAL_FILE).is_file() and (out / JOURNAL_FILE).read_text().count("\n") >= 1):
            assert proc.poll() is None, "the suite ended before it was killed"
            assert time.monotonic() < deadline, "no job finished in 180 s"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    before = _journal(out)
    assert 1 <= len(before) < 4
    assert not (out / "results.json").exists()
    # `--resume DIR` alone takes the suite's saved command line.
    assert main(["optimize", "--resume", str(out), "--quiet"]) == 0
    after = _journal(out)
    keys = [(r["problem"], r["mode"], r["repeat"]) for r in after]
    assert len(keys) == len(set(keys)) == 4
    assert after[:len(before)] == before     # the finished jobs' lines stand, none ran again
    assert {r["job_id"] for r in before} & {r["job_id"] for r in after[len(before):]} == set()
    assert json.loads((out / "results.json").read_text())["complete"]
    plan = SuitePlan.load(out)
    assert plan.repeats == 2 and plan.modes == ["sequential"]
