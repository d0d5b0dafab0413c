"""`specgen optimize --clock virtual` (cli/optimize_virtual.py): the first run's default, a replayed
trace's job and a sequential run of it on the virtual clock, on programs evaluated for real."""
from __future__ import annotations

import json
import stat

import pytest

from specgen.bench.config import programs_in
from specgen.cli import main
from specgen.simulate.model import program_key
from specgen.traces.bundled import default_run
from specgen.traces.format import Trace

from tests.optimize.conftest import PROBLEMS


def test_the_first_run_is_on_the_virtual_clock_and_shows_the_screen(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["optimize", "--devices", "cpu", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "No engine configured: replaying the bundled generated" in err
    assert "Virtual clock: every program of the trace is validated and profiled for real" in err
    assert "This run (virtual clock)" in err and "Sequential, same trace (virtual clock)" in err
    assert "Saved: " in err and "Evaluations: " in err
    assert stat.S_IMODE(out.stat().st_mode) == 0o700

    summary = json.loads((out / "virtual.json").read_text())
    jobs = {j["mode"]: j for j in summary["jobs"]}
    assert set(jobs) == {"specgen", "sequential"}
    # Every program the trace can submit was evaluated for real, once.
    trace = Trace.load(default_run(gpu=False)[1])
    assert {r["program"] for r in summary["evaluations"]} == {program_key(s) for s in programs_in(trace)}
    for job in jobs.values():
        assert 0 < job["reasoning_read_tokens"] <= job["reasoning_tokens"]
        assert job["validated"] >= 1
    best = jobs["specgen"]["best_program"]
    if best is not None:
        kernel = (out / "best_kernel.py").read_text()
        assert program_key(kernel) == best and "class ModelNew" in kernel


def test_a_run_stopped_by_its_target_reads_less_and_saves_against_sequential(tmp_path, capsys) -> None:
    # The hand-written trace drafts a correct kernel early in its first turn; any correct kernel
    # meets a target of 0.001x, so the job ends at that draft's verdict.
    out = tmp_path / "run"
    assert main(["optimize", str(PROBLEMS / "fused_elementwise.py"), "--clock", "virtual",
                 "--target-speedup", "0.001", "--devices", "cpu", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    summary = json.loads((out / "virtual.json").read_text())
    jobs = {j["mode"]: j for j in summary["jobs"]}
    spec, seq = jobs["specgen"], jobs["sequential"]
    assert spec["status"] == "target_reached"
    assert spec["reasoning_read_tokens"] < spec["reasoning_tokens"]
    assert spec["validated_during"] >= 1
    assert spec["end_to_end_s"] < seq["end_to_end_s"]
    assert "Reasoning: stopped early" in err
    saved = seq["end_to_end_s"] - spec["end_to_end_s"]
    assert f"Saved: {saved:.1f} s" in err


@pytest.mark.parametrize("argv, words", [
    (["--clock", "virtual", str(PROBLEMS / "softmax.py"), "--llm", "openai", "--base-url", "http://x/v1",
      "--model", "m", "--tokenizer", "t"], "--clock virtual replays a trace"),
    (["--clock", "virtual", "--fork-model", "scripted"], "fork model 'scripted' is not simulated"),
    (["--clock", "virtual", "--scheduler", "tcp://127.0.0.1:9"], "--scheduler needs --clock wall"),
    (["--clock", "virtual", "--max-iterations", "1", "--no-forking"],
     "--max-iterations, --no-forking needs --clock wall"),
])
def test_what_the_virtual_clock_does_not_model_is_refused(argv, words, tmp_path, capsys) -> None:
    assert main(["optimize", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_a_flag_of_the_runtime_makes_the_first_run_a_wall_clock_run() -> None:
    import argparse

    from specgen.cli.optimize_virtual import wants_virtual

    def args(**given):
        base = dict(clock=None, problem=None, llm=None, trace=None, scheduler=None, resume=None,
                    time_budget=None, token_budget=None, max_iterations=None, no_forking=False,
                    no_early_termination=False, no_inline_candidates=False, no_load_aware=False,
                    static_pools=False, drain_speculative=False, evaluation=None, kv_pool="auto")
        return argparse.Namespace(**{**base, **given})

    assert wants_virtual(args())
    assert not wants_virtual(args(evaluation="runtime"))
    assert not wants_virtual(args(problem="p.py"))
    assert not wants_virtual(args(kv_pool="host"))
    assert wants_virtual(args(problem="p.py", clock="virtual"))
    assert not wants_virtual(args(clock="wall"))


def test_a_trace_whose_answers_cannot_run_here_claims_no_saving(tmp_path, capsys) -> None:
    # A CUDA answer on a host without a GPU: no answer can be judged, so no comparison is printed.
    from specgen.optimize.bench_problems import generated_problems
    from specgen.traces.extraction import extract_candidate

    (problem,) = generated_problems(1, 1, 4, ["softmax"], ("cuda",))   # seed 4: a CUDA answer
    answer = extract_candidate(problem.trace.iterations[0].final.text, accept_unclosed=True)
    assert answer is not None and "load_inline" in answer
    trace = problem.trace.save(tmp_path / "softmax.trace.json")
    out = tmp_path / "run"
    assert main(["optimize", str(PROBLEMS / "softmax.py"), "--trace", str(trace), "--clock", "virtual",
                 "--devices", "cpu", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    summary = json.loads((out / "virtual.json").read_text())
    assert summary["answers_judged"] * 2 < summary["answers"] and summary["no_headline"]
    assert "not compared: only 0 of" in err
    assert "Saved: not claimed" in err and "Saved: nothing" not in err
