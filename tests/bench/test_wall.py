"""`specgen bench` end to end on the CPU: generated traces, two modes, real evaluation, the report."""
from __future__ import annotations

import asyncio
import json
import math
import stat
from pathlib import Path

import pytest

from specgen.bench.config import BenchConfig, programs_in
from specgen.bench.report import _union, geomean_ci, summarize
from specgen.bench.wall import BenchRun, _one_job
from specgen.cli import main
from specgen.errors import UsageError
from specgen.traces.format import TraceBuilder
from specgen.messages import JobMetrics, OptimizeResult, Verdict
from specgen.optimize import loop
from specgen.optimize.bench_problems import generated_problems, problems_from_traces
from specgen.traces.bundled import bundled_problem


def test_union_and_geomean() -> None:
    assert _union([(0, 2), (1, 3), (5, 6)]) == 4   # [0, 3] and [5, 6]
    ci = geomean_ci([0.5, 0.5, 0.5])
    assert ci["geomean"] == pytest.approx(0.5) and ci["low"] == pytest.approx(0.5)
    wide = geomean_ci([0.25, 1.0, 4.0])
    assert wide["geomean"] == pytest.approx(1.0) and wide["low"] < 1.0 < wide["high"]
    assert geomean_ci([])["geomean"] is None


def test_bench_runs_modes_side_by_side_and_reports(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench"
    code = main(["bench", "--clock", "wall", "--generate", "2", "--turns", "1", "--concurrency", "2",
                 "--speed", "40", "--modes", "specgen,sequential", "--problems", "softmax", "--seed", "3",
                 "--eval-timeout", "120", "--out", str(out), "--quiet"])
    assert code == 0
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["fork_model"] == "draft" and "CPU timing" in data["hardware"]
    assert data["config"]["eval_timeout_s"] == 120
    assert {(j["mode"], j["problem"]) for j in data["jobs"]} == {
        (m, p) for m in ("specgen", "sequential") for p in ("softmax#0", "softmax#1")}
    for job in data["jobs"]:
        assert job["end_to_end_s"] > 0 and job["tokens"] > 0
    for mode in ("specgen", "sequential"):
        u = data["utilization"][mode]["of_run"]
        assert u is not None and 0 < u <= 1
        queued = data["utilization"][mode]["while_queued"]     # the scheduler's own measure
        assert queued is None or 0 <= queued <= 1
    assert all("busy_while_queued" in b for b in data["batches"])
    # Each evaluation names its program, so the simulator can take its measured verdicts.
    evaluations = [e for job in data["intervals"] for e in job["evaluations"]]
    assert evaluations and all(len(e["program"]) >= 16 for e in evaluations)
    # Each mode waited for its own builds (none inherited the other mode's): a mode that evaluated a
    # program with an extension built one.
    for mode in ("specgen", "sequential"):
        builds = [e["stage_seconds"]["build"] for job in data["intervals"] if job["mode"] == mode
                  for e in job["evaluations"] if "build" in (e.get("stage_seconds") or {})]
        assert not builds or max(builds) > 0.5, (mode, builds)
    ratio = data["ratios"]["end_to_end_s"]
    assert ratio["n"] == 2 and math.isfinite(ratio["geomean"])
    assert 0 < data["ceiling"] <= 1
    assert 0 < data["named_ceiling"] <= data["ceiling"]   # a fork that writes stops no later
    report = (out / "report.md").read_text()
    assert "against the draft ceiling" in report and "against the named ceiling" in report
    assert "specgen / best fair baseline, end-to-end" in report
    assert "specgen / sequential, end-to-end" in report and "answers judged here" in report
    for png in ("speedup_over_time.png", "worker_timeline.png", "ratio_per_problem.png",
                "timeline_per_problem.png"):
        assert (out / png).stat().st_size > 1000
    # The bench's folder and what it writes there are private (its jobs' problems and kernels).
    # The evaluation cache in it is the workers' (sandboxed runners of another user read it through
    # a view of their own, so its own mode lets them in); the folder around it keeps others out.
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    for path in out.iterdir():
        if path.name != "eval-cache":
            assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path


def test_bench_bad_input_is_a_usage_error(tmp_path: Path, capsys) -> None:
    assert main(["bench", "--out", str(tmp_path)]) == 2
    assert "give trace files or --generate N" in capsys.readouterr().err
    assert main(["bench", "--generate", "1", "--fork-model", "model", "--out", str(tmp_path)]) == 2
    assert main(["bench", "--generate", "1", "--timing", "warp=9", "--out", str(tmp_path)]) == 2
    assert "unknown setting 'warp'" in capsys.readouterr().err
    # The evaluation flags are checked as optimize checks them (one table, cli/optimize_job.py).
    assert main(["bench", "--generate", "1", "--eval-timeout", "-1", "--out", str(tmp_path)]) == 2
    assert "--eval-timeout must be more than 0 seconds, got -1" in capsys.readouterr().err


def sample_trace(path: Path, problem: str, reasoning: str, answer: str) -> Path:
    builder = TraceBuilder(token_rate=100.0, problem=problem, hand_written=False)
    builder.add_iteration(reasoning, forks=[], final_text=f"```python\n{answer}```\n")
    return builder.build().save(path)


PROGRAM = ("import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
           "        return torch.softmax(x, dim=1)\n")


def test_samples_of_one_problem_are_entries_of_their_own(tmp_path: Path, monkeypatch) -> None:
    # What `specgen trace import` writes for three independent samples of softmax, and layernorm.
    paths = [sample_trace(tmp_path / f"softmax.{n}.trace.json", "softmax", f"Sample {n}.", PROGRAM)
             for n in range(3)]
    paths.insert(1, sample_trace(tmp_path / "layernorm.trace.json", "layernorm", "Other.", PROGRAM))
    problems = problems_from_traces(paths)
    assert [p.name for p in problems] == ["softmax#0", "layernorm", "softmax#2", "softmax#3"]
    assert [p.problem for p in problems] == ["softmax", "layernorm", "softmax", "softmax"]
    assert [p.trace_path for p in problems] == paths
    softmax = bundled_problem("softmax").read_text()
    assert all(p.source == softmax for p in problems if p.problem == "softmax")

    async def fake_run_job(spec, engine, backend):
        seconds = {"softmax#0": 10.0, "layernorm": 20.0, "softmax#2": 30.0, "softmax#3": 40.0}
        entry = spec.job_id.split("-")[3]             # bench-run-<batch>-<entry>-<mode>
        answer = _candidate("a0", 0, "final", "correct",
                            Verdict(correct=True, compiled=True, speedup=1.5), 1.0)
        return OptimizeResult(job_id=spec.job_id, problem_name=spec.problem_name, mode=spec.mode,
                              status="iterations_done", best_speedup=1.5, candidates=[answer],
                              metrics=JobMetrics(end_to_end_s=seconds[entry]))

    monkeypatch.setattr(loop, "run_job", fake_run_job)
    config = BenchConfig(problems=problems, modes=["specgen", "sequential"])
    config.check()
    jobs = [asyncio.run(_one_job(config, p, mode, None, 0)) for p in problems
            for mode in config.modes]
    # Distinct job ids; every sample's jobs evaluate against the problem itself.
    assert len({j.result.job_id for j in jobs}) == len(jobs) == 8
    assert {j.result.problem_name for j in jobs} == {"softmax", "layernorm"}
    summary = summarize(BenchRun(config={"modes": config.modes}, jobs=jobs))
    assert {(f["mode"], f["problem"]) for f in summary["jobs"]} == {
        (m, p.name) for m in config.modes for p in problems}
    assert sorted(summary["ratios"]["end_to_end_s"]["per_problem"]) == sorted(p.name for p in problems)
    assert summary["per_mode"]["specgen"]["problems_with_correct_kernel"] == 4
    # Names stay distinct across traces and generated problems, or the run says so.
    mixed = BenchConfig(problems=problems_from_traces(paths[1:2]) + generated_problems(
        1, 1, seed=3, names=["layernorm"]))
    with pytest.raises(UsageError, match="layernorm given more than once"):
        mixed.check()


def test_prebuilt_programs_include_unfenced_drafts(tmp_path: Path) -> None:
    unfenced = PROGRAM.replace("dim=1", "dim=-1")
    fenced = PROGRAM.replace("softmax(x, dim=1)", "softmax(x.float(), dim=1)")
    reasoning = (f"Let me write it plainly first.\n\n{unfenced}\nWait, check the dim.\n\n"
                 f"```python\n{fenced}```\nAnd the last one, right before the answer:\n\n{PROGRAM}")
    trace = TraceBuilder(token_rate=100.0, problem="softmax", hand_written=False)
    trace.add_iteration(reasoning, forks=[], final_text=f"```python\n{PROGRAM}```\n")
    assert programs_in(trace.build()) == [unfenced, fenced, PROGRAM]


def _candidate(cid: str, iteration: int, origin: str, status: str, verdict, feedback_at):
    from specgen.messages import CandidateRecord, CandidateUpdate

    update = CandidateUpdate(job_id="j", candidate_id=cid, stage="full", verdict=verdict,
                             started_at=1.0, finished_at=2.0)
    return CandidateRecord(candidate_id=cid, iteration=iteration, origin=origin, request_id="r",
                           position=0, fingerprint=cid, source="", extracted_at=1.0,
                           status=status, validation=update, profile=update,
                           feedback_at=feedback_at)


def _job(mode: str, problem: str, seconds: float, candidates, iteration_starts) -> "BenchJobRecord":
    from specgen.messages import IterationRecord
    from specgen.bench.wall import BenchJobRecord

    result = OptimizeResult(job_id=f"{mode}-{problem}", problem_name=problem, mode=mode,
                            status="iterations_done", started_at=0.0, candidates=candidates,
                            iterations=[IterationRecord(index=i, started_at=t)
                                        for i, t in enumerate(iteration_starts)],
                            metrics=JobMetrics(end_to_end_s=seconds))
    return BenchJobRecord(mode=mode, problem=problem, batch=0, result=result, intervals=[])


def test_pipeline_is_no_baseline_where_it_skipped_a_verdict() -> None:
    good = Verdict(correct=True, compiled=True, speedup=1.2)

    def answers(feedback):   # two turns' answers, verdicts at the given times
        return [_candidate(f"a{i}", i, "final", "correct", good, t) for i, t in enumerate(feedback)]

    jobs = [_job("specgen", "p", 80.0, answers([40.0, 80.0]), [0.0, 40.0]),
            _job("sequential", "p", 100.0, answers([50.0, 100.0]), [0.0, 50.0]),
            # turn 1 began at 30 s, before turn 0's verdict at 50 s: a free turn in replay
            _job("pipeline", "p", 60.0, answers([50.0, 60.0]), [0.0, 30.0])]
    summary = summarize(BenchRun(config={"modes": ["specgen", "sequential", "pipeline"]},
                                 jobs=jobs))
    ratios = summary["ratios"]
    assert ratios["end_to_end_s"]["per_problem"] == {"p": pytest.approx(0.8)}
    assert ratios["end_to_end_s"]["baseline_per_problem"] == {"p": "sequential"}
    assert ratios["end_to_end_s_vs_sequential"]["geomean"] == pytest.approx(0.8)
    assert ratios["pipeline_not_a_baseline"] == {"p": 1}
    assert summary["jobs"][2]["turns_without_verdict"] == 1
    # A pipeline that waited for every verdict is a baseline like the others.
    jobs[2] = _job("pipeline", "p", 60.0, answers([20.0, 60.0]), [0.0, 30.0])
    again = summarize(BenchRun(config={"modes": ["specgen", "sequential", "pipeline"]}, jobs=jobs))
    assert again["ratios"]["end_to_end_s"]["baseline_per_problem"] == {"p": "pipeline"}
    assert again["ratios"]["pipeline_not_a_baseline"] == {}


def test_no_ratio_without_answers_judged_here() -> None:
    from specgen.bench.report import table

    unbuilt = Verdict(correct=False, compiled=False,
                      error="extension softmax_ext failed to build: nvcc not found")
    wrong = Verdict(correct=False, compiled=True, error="output mismatch at [0, 1]")
    run = BenchRun(config={"modes": ["specgen", "sequential"], "fork_model": "draft", "speed": 1.0,
                           "concurrency": 1, "improvement_margin": None},
                   jobs=[_job("specgen", "p", 10.0,
                              [_candidate("a0", 0, "final", "failed", unbuilt, 5.0),
                               _candidate("f0", 0, "fork", "incorrect", wrong, 3.0)], [0.0]),
                         _job("sequential", "p", 12.0,
                              [_candidate("a0", 0, "final", "failed", unbuilt, 6.0)], [0.0])])
    summary = summarize(run)
    assert summary["evidence"]["answers"] == 2 and summary["evidence"]["answers_judged"] == 0
    assert summary["per_mode"]["specgen"]["speculative_judged"] == 1
    assert summary["no_headline"].startswith("only 0 of 2 answers")
    assert summary["ratios"] == {}
    text = table({**summary, "hardware": "cpu", "ceiling": 1.0})
    assert "no ratio is printed" in text and "best fair baseline" not in text
    # Counted by the verdict's fields (a CPU device), with the first error line as an example.
    assert ("2 x answer: did not build or load on cpu (no GPU here: CUDA code cannot be judged on "
            "it) (e.g. extension softmax_ext failed to build: nvcc not found)") in text
    assert "reasoning at the timing model's real pace" in text
    assert "improvement margin none (no turn ends on an improvement)" in text
    from specgen.bench.report import devices_text
    assert devices_text(["cuda:0"] * 8 + ["cuda:1"]) == "8 on cuda:0, 1 on cuda:1"


def test_a_compile_error_on_the_gpu_is_a_wrong_answer_and_the_ratio_is_printed() -> None:
    """A build error where the kernel should run (a GPU) is the answer's verdict: judged, wrong,
    counted in the evidence, and the ratio stands. A timeout or a cancellation is not judged, and
    is counted by reason per mode."""
    from specgen.bench.report import table

    broken = Verdict(correct=False, compiled=False, device="cuda:0", cpu_timing=False,
                     error="extension k_ext failed to build: error: expected ';'")
    good = Verdict(correct=True, compiled=True, speedup=1.2, device="cuda:0", cpu_timing=False)
    late = Verdict(correct=False, compiled=True, device="cuda:0", code="timeout", error="timed out")
    run = BenchRun(config={"modes": ["specgen", "sequential"], "fork_model": "draft", "speed": 1.0,
                           "concurrency": 1, "improvement_margin": 0.1},
                   jobs=[_job("specgen", "p", 8.0,
                              [_candidate("a0", 0, "final", "failed", broken, 4.0),
                               _candidate("a1", 1, "final", "correct", good, 8.0),
                               _candidate("f0", 0, "fork", "incorrect", late, 3.0)], [0.0, 4.0]),
                         _job("sequential", "p", 10.0,
                              [_candidate("a0", 0, "final", "failed", broken, 5.0),
                               _candidate("a1", 1, "final", "correct", good, 10.0)], [0.0, 5.0])])
    summary = summarize(run)
    assert summary["evidence"]["answers"] == summary["evidence"]["answers_judged"] == 4
    assert summary["no_headline"] is None
    assert summary["ratios"]["end_to_end_s_vs_sequential"]["geomean"] == pytest.approx(0.8)
    assert summary["per_mode"]["specgen"]["speculative_judged"] == 0
    assert summary["evidence"]["not_judged"] == {"speculative: ran past its time limit": 1}
    text = table({**summary, "hardware": "cuda", "ceiling": 1.0})
    assert "| specgen | 2 of 2 | 0 of 1 |" in text and "| sequential | 2 of 2 | 0 of 0 |" in text
    assert "- 1 x speculative: ran past its time limit (e.g. timed out)" in text
    assert "specgen / sequential, end-to-end: 0.800" in text


def test_repeats_report_an_interval_over_seeds(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    code = main(["bench", "--clock", "wall", "--generate", "1", "--turns", "1", "--concurrency", "1",
                 "--speed", "40", "--modes", "specgen,sequential", "--problems", "softmax", "--seed", "3",
                 "--repeats", "2", "--eval-timeout", "120", "--out", str(out), "--quiet"])
    assert code == 0
    rows = json.loads((out / "repeats.json").read_text())
    assert [r["variant"] for r in rows] == ["main", "repeat 1"]
    assert all(r["vs_sequential"] and r["vs_sequential"] > 0 for r in rows)
    # The second repeat is its own run on the next seed's traces, written beside the first.
    first = json.loads((out / "results.json").read_text())
    second = json.loads((out / "repeat-1" / "results.json").read_text())
    assert first["config"]["problems"] != second["config"]["problems"]
    text = (out / "repeats.md").read_text()
    assert "over 2 repeats (seeds)" in text and "t over repeats" in text


def test_repeats_must_be_positive(tmp_path: Path, capsys) -> None:
    code = main(["bench", "--generate", "1", "--repeats", "0", "--out", str(tmp_path / "b")])
    assert code == 2 and "--repeats 0" in capsys.readouterr().err
