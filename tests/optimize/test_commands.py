"""`specgen optimize` end to end: the bundled example through the actor runtime, and bad input."""
from __future__ import annotations

import json

import msgspec
import pytest

from specgen.cli import main
from specgen.messages import OptimizeEvent, OptimizeResult

from .chrome_trace import load_chrome_trace
from .conftest import PROBLEMS


def test_default_run_replays_the_bundled_trace_through_the_runtime(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    code = main(["optimize", "--speed", "12", "--max-iterations", "1", "--trials", "2",
                 "--timing-trials", "5", "--devices", "cpu,cpu", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "No engine configured: replaying the bundled hand-written trace" in captured.err
    assert "fused_elementwise" in captured.err and "CPU timings" in captured.err

    result = msgspec.json.decode((out / "result.json").read_bytes(), type=OptimizeResult)
    assert result.mode == "specgen" and result.status == "iterations_done"
    assert result.best_speedup is not None and result.cpu_timing
    assert (out / "best_kernel.py").read_text() == result.best_source
    assert "class ModelNew" in result.best_source
    # Evaluated by the runtime's workers (named by their node), not in this process.
    workers = {c.validation.worker for c in result.candidates if c.validation is not None}
    assert workers and all(w.startswith("local0/") for w in workers)

    lines = (out / "events.jsonl").read_text().splitlines()
    events = [msgspec.json.decode(line, type=OptimizeEvent) for line in lines]
    assert events[0].kind == "job_started" and events[-1].kind == "job_finished"
    assert sum(1 for e in events if e.kind == "fork_started") == result.metrics.forks

    trace_events = load_chrome_trace(out / "timeline.json")
    spans = {e["cat"] for e in trace_events if e["ph"] == "X"}
    assert {"reasoning", "fork", "validate", "profile"} <= spans
    json.loads((out / "result.json").read_text())        # plain JSON for other tools too


@pytest.mark.parametrize("argv, words", [
    (["optimize", "--llm", "vllm"], "needs a PROBLEM.py"),
    (["optimize", str(PROBLEMS / "softmax.py"), "--llm", "vllm"], "--model"),
    (["optimize", str(PROBLEMS / "softmax.py"), "--llm", "openai", "--model", "m"],
     "--base-url, --tokenizer"),
    (["optimize", "missing_problem.py"], "missing_problem.py not found"),
    (["optimize", "--trace", "no/such/trace.json"], "no/such/trace.json not found"),
    (["optimize", str(PROBLEMS / "softmax.py")], "no bundled trace for softmax"),
    (["optimize", "--trace", str(PROBLEMS / "softmax.py"), "--llm", "vllm"], "cannot go with"),
    (["optimize", "--devices", "gpu0"], "neither cpu nor cuda:N"),
    (["optimize", "--timing-trials", "1"], "--timing-trials must be at least 2"),
    (["optimize", "--max-iterations", "0"], "max_iterations must be >= 1"),
])
def test_bad_input_is_one_line_and_exit_code_2(argv, words, capsys, tmp_path) -> None:
    code = main(argv + ["--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert words in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_malformed_trace_is_named(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.trace.json"
    bad.write_text('{"format": "specgen-trace", "version": 1}')
    code = main(["optimize", "--trace", str(bad), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and str(bad) in err and "metadata" in err
