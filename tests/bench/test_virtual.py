"""`specgen bench --clock virtual`: programs measured once for real, every mode simulated on them."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from specgen.bench.virtual import _programs
from specgen.cli import main
from specgen.messages import TriggerSettings
from specgen.optimize.bench_problems import generated_problems
from specgen.traces.extraction import extract_candidate, first_naming
from specgen.traces.synthetic import CandidateLibrary, generate_turn
from specgen.simulate.model import ServiceTimes, program_key, script_turn


def test_every_program_is_measured_once_and_every_mode_simulated_on_it(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench"
    code = main(["bench", "--generate", "2", "--turns", "2", "--concurrency", "2",
                 "--modes", "specgen,sequential,best-of-n", "--problems", "softmax,layernorm",
                 "--seed", "3", "--out", str(out), "--quiet"])
    assert code == 0
    data = json.loads((out / "results.json").read_text())
    assert data["clock"] == "virtual" and data["speed"] == 1.0
    # Each distinct program of the traces once (one CPU device: the two workers share it).
    problems = generated_problems(2, 2, 3, ["softmax", "layernorm"], ("torch", "cpp"))
    expected = {(p.name.split("#")[0], program_key(s)) for p, s, _ in _programs(problems)}
    measured = [(r["problem"], r["program"]) for r in data["evaluations"]]
    assert sorted(measured) == sorted(expected) and len(set(measured)) == len(measured)
    assert all(r["validate_s"] > 0 and r["judged"] for r in data["evaluations"])
    # Each C++ program's build was timed on a cold cache, apart from its evaluation.
    built = [r for r in data["evaluations"] if "build_s" in r]
    assert built and all(r["build_s"] > 0.5 for r in built)
    assert all(r.get("profile_s") for r in data["evaluations"] if r.get("speedup"))
    # Every simulated candidate was one of the measured programs; every job finished its turns.
    for mode, m in data["per_mode"].items():
        assert m["unmeasured"] == 0 and m["jobs"] == 2, mode
    assert {(j["mode"], j["problem"]) for j in data["jobs"]} == {
        (m, p.name) for m in ("specgen", "sequential", "best-of-n") for p in problems}
    assert data["ratios"]["vs_sequential"]["n"] == 2
    report = (out / "report.md").read_text()
    assert "virtual clock" in report and "real pace" in report
    assert "improvement margin 0.1" in report
    assert "evaluation workers: 2 on cpu" in report and "CPU timing" in report
    assert "against the draft ceiling" in report and "against the named ceiling" in report
    # The measured service times serve the simulator at scale too; a replay needs a wall run.
    service = ServiceTimes.from_bench(out)
    assert set(service.program_durations) == {fp for _, fp in expected}
    assert main(["simulate", "--from-bench", str(out), "--gpus", "4", "--jobs", "2",
                 "--hours", "0.05"]) == 0
    assert main(["simulate", "--replay-bench", str(out)]) == 2
    assert "nothing to replay against" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [["--fork-model", "model", "--llm", "openai", "--model", "m",
                                   "--base-url", "http://127.0.0.1:9/v1"],
                                  ["--sensitivity"], ["--kv-pool-effect"],
                                  ["--time-budget", "60"]])
def test_what_only_the_wall_clock_runs_is_refused(tmp_path: Path, capsys, flag: list[str]) -> None:
    code = main(["bench", "--generate", "1", *flag, "--out", str(tmp_path / "b")])
    assert code == 2
    assert "--clock wall" in capsys.readouterr().err


def test_a_named_fork_writes_the_answer_once_its_kernel_is_named() -> None:
    library = CandidateLibrary.load()
    rng = random.Random("named-script")
    seen = 0
    for _ in range(40):
        reasoning, final_text, _ = generate_turn("softmax", library, rng, ("torch", "cpp"))
        final = extract_candidate(final_text, accept_unclosed=True)
        named = first_naming(reasoning, final) if final else None
        draft = script_turn("softmax", reasoning, final_text, TriggerSettings(), True, True)
        script = script_turn("softmax", reasoning, final_text, TriggerSettings(), True, True,
                             fork_model="named")
        forks = [(d, n) for d, n in zip(draft.firings, script.firings) if n.kind == "fork"]
        for as_draft, as_named in forks:
            if named is not None and as_named.char > named:
                assert as_named.fork_answer == final
                seen += 1
            else:
                assert as_named.fork_answer == as_draft.fork_answer
    assert seen > 0


def test_repeats_on_the_virtual_clock(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    code = main(["bench", "--generate", "1", "--turns", "1", "--concurrency", "1",
                 "--modes", "specgen,sequential", "--problems", "softmax", "--seed", "3",
                 "--repeats", "2", "--out", str(out), "--quiet"])
    assert code == 0
    rows = json.loads((out / "repeats.json").read_text())
    assert [r["variant"] for r in rows] == ["main", "repeat 1"]
    assert json.loads((out / "repeat-1" / "results.json").read_text())["clock"] == "virtual"
    assert "over 2 repeats (seeds)" in (out / "repeats.md").read_text()


def test_no_ratio_when_most_answers_could_not_be_judged_here() -> None:
    from specgen.bench.config import BenchConfig
    from specgen.bench.virtual import summarize, table

    problems = generated_problems(1, 1, 3, ["softmax"], ("torch",))
    config = BenchConfig(problems=problems, modes=["specgen", "sequential"])
    rows = [{"problem": "softmax", "program": "a", "final": True, "judged": False, "correct": False},
            {"problem": "softmax", "program": "b", "final": True, "judged": False, "correct": False},
            {"problem": "softmax", "program": "c", "final": True, "judged": True, "correct": True}]
    job = {"problem": problems[0].name, "end_to_end_s": 10.0, "profiled": 0, "best_speedup": None,
           "unmeasured": 0}
    modes = {m: {"jobs": [job], "feedback_p50_s": None, "utilization": None} for m in config.modes}
    summary = summarize(config, rows, modes)
    assert summary["no_headline"] == ("only 1 of 3 answers could be judged on this machine: "
                                      "no ratio is printed")
    assert summary["ratios"] == {}
    text = table(summary)
    assert "no ratio is printed" in text and "specgen / sequential" not in text
    # Rows measured before reasons were recorded keep their verdict, counted under that.
    assert summary["not_judged"] == {"answer: not judged (the measurement recorded no reason)": 2}


def _rows_from(verdicts: list[tuple[str, bool, "Verdict"]]) -> list[dict]:
    """Measured rows as `measure` writes them, from (program, is an answer, validation verdict)."""
    from specgen.bench.virtual import _not_judged

    rows = []
    for program, final, verdict in verdicts:
        why = _not_judged(verdict)
        rows.append({"problem": "softmax", "program": program, "final": final, "judged": not why,
                     "not_judged": why, "correct": verdict.correct,
                     "error": verdict.error or "", "device": verdict.device})
    return rows


def _summary(rows: list[dict]) -> dict:
    from specgen.bench.config import BenchConfig
    from specgen.bench.virtual import summarize

    problems = generated_problems(1, 1, 3, ["softmax"], ("torch",))
    config = BenchConfig(problems=problems, modes=["specgen", "sequential"])
    jobs = {"specgen": 8.0, "sequential": 10.0}
    modes = {m: {"jobs": [{"problem": problems[0].name, "end_to_end_s": jobs[m], "profiled": 1,
                           "best_speedup": None, "unmeasured": 0}],
                 "feedback_p50_s": None, "utilization": None} for m in config.modes}
    return summarize(config, rows, modes)


def test_a_compile_error_on_the_gpu_is_a_judged_answer_and_the_ratio_is_printed() -> None:
    from specgen.bench.virtual import table
    from specgen.messages import Verdict

    gpu = dict(device="cuda:0", cpu_timing=False)
    rows = _rows_from([
        ("a", True, Verdict(compiled=False, error="extension a_ext failed to build: error: x", **gpu)),
        ("b", True, Verdict(compiled=False, error="ImportError: undefined symbol", **gpu)),
        ("c", True, Verdict(compiled=True, correct=True, **gpu)),
        ("d", False, Verdict(compiled=True, code="timeout", error="ran past 300 s", **gpu)),
    ])
    summary = _summary(rows)
    assert (summary["answers"], summary["answers_judged"]) == (3, 3)
    assert (summary["drafts"], summary["drafts_judged"]) == (1, 0)
    assert summary["no_headline"] is None
    assert summary["ratios"]["vs_sequential"]["geomean"] == pytest.approx(0.8)
    assert summary["not_judged"] == {"draft: ran past its time limit": 1}
    text = table(summary)
    assert "answers judged here: 3 of 3" in text and "specgen / sequential, end-to-end: 0.800" in text
    assert "- 1 x draft: ran past its time limit (e.g. ran past 300 s)" in text


def test_what_a_cpu_host_cannot_build_is_counted_by_reason_and_stops_the_ratio() -> None:
    from specgen.bench.virtual import table
    from specgen.messages import Verdict

    rows = _rows_from([
        ("a", True, Verdict(compiled=False, error="extension a_ext failed to build: nvcc not found")),
        ("b", True, Verdict(compiled=False, error="extension b_ext failed to build: nvcc not found")),
        ("c", True, Verdict(compiled=False, code="candidate_source", error="candidate: no ModelNew")),
    ])
    summary = _summary(rows)
    assert (summary["answers"], summary["answers_judged"]) == (3, 1)     # the text is wrong anywhere
    assert summary["no_headline"] and summary["ratios"] == {}
    key = "answer: did not build or load on cpu (no GPU here: CUDA code cannot be judged on it)"
    assert summary["not_judged"] == {key: 2}
    text = table(summary)
    assert f"- 2 x {key} (e.g. extension a_ext failed to build: nvcc not found)" in text
    assert "not judged (measured programs, every mode alike), by reason:" in text
    assert "no ratio is printed" in text


def test_measured_programs_are_simulated_again_elsewhere(tmp_path: Path, capsys) -> None:
    """`--measured` reads an earlier run's rows (results.json or the measured.jsonl written as it
    went) and measures nothing; rows for other traces are an error that says what is missing."""
    first = tmp_path / "first"
    args = ["bench", "--generate", "1", "--turns", "1", "--concurrency", "1", "--modes",
            "specgen,sequential", "--problems", "softmax", "--seed", "3", "--quiet"]
    assert main([*args, "--out", str(first)]) == 0
    rows = json.loads((first / "results.json").read_text())["evaluations"]
    assert [json.loads(line) for line in (first / "measured.jsonl").read_text().splitlines()] == rows
    assert all("spare_wait" in r["validate_stages"] and r["validate_stages"]["runner_startup"] > 0
               for r in rows if r["judged"])
    for source in ("results.json", "measured.jsonl"):
        again = tmp_path / f"again-{source}"
        assert main([*args, "--fork-model", "named", "--measured", str(first / source),
                     "--out", str(again)]) == 0
        data = json.loads((again / "results.json").read_text())
        assert data["evaluations"] == rows and data["measured_from"] == str(first / source)
        assert not (again / "measured").exists()          # no worker was started
    assert main([*args, "--seed", "4", "--measured", str(first / "results.json"),
                 "--out", str(tmp_path / "other")]) == 2
    assert "of this bench's programs were not measured there" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{\"clock\": \"wall\"}")
    assert main([*args, "--measured", str(tmp_path / "bad.json"), "--out", str(tmp_path / "b")]) == 2
    assert "not the results.json of a `specgen bench --clock virtual` run" in capsys.readouterr().err
    assert main([*args, "--clock", "wall", "--measured", str(first / "results.json"),
                 "--out", str(tmp_path / "w")]) == 2
    assert "needs --clock virtual" in capsys.readouterr().err


def test_a_measured_runner_wait_is_modelled_not_kept_in_the_service_time() -> None:
    rows = [{"problem": "softmax", "program": "p", "final": True, "judged": True, "correct": True,
             "validate_s": 2.0, "validate_stages": {"spare_wait": 0.5, "runner_startup": 0.3},
             "profile_s": 3.0, "profile_stages": {"spare_wait": 0.0, "runner_startup": 0.2},
             "speedup": 1.5},
            {"problem": "softmax", "program": "q", "final": False, "judged": True, "correct": False,
             "validate_s": 1.0}]
    times = ServiceTimes.from_measured(rows)
    assert times.program_durations["p"] == {"validate": [1.5], "profile": [3.0]}
    assert times.program_durations["q"] == {"validate": [1.0]}      # an older row: kept whole
    assert sorted(times.runner_startup_s) == [0.2, 0.3]
    assert times.program_takes_runner == {"p": [True], "q": [False]}


def test_the_named_ceilings_saving_is_split_by_what_the_loop_could_stop_on() -> None:
    from specgen.bench.ceiling import ceiling
    from specgen.bench.virtual import named_saving_split

    problems = generated_problems(8, 3, 1, None, ("torch", "cpp"))
    _, turns = ceiling([p.trace for p in problems])
    assert any(t.named_stop_tokens < t.total_tokens for t in turns)
    finals = [(p.name.split("#")[0], program_key(extract_candidate(it.final.text, accept_unclosed=True)))
              for p in problems for it in p.trace.iterations]
    saved = {p.name: sum(t.total_tokens - t.named_stop_tokens for t in turns if t.problem == p.trace.metadata.problem)
             for p in problems}
    first = problems[0].name.split("#")[0]
    assert named_saving_split(problems, turns, [], 0.1)["not_correct"] == 1.0
    # Every answer correct, each new program twice as fast as any before it in its job: only a turn
    # whose answer repeats an earlier answer of its job improves on nothing.
    faster: dict = {}
    repeated = 0
    for (name, key), turn in zip(finals, turns):
        if (name, key) in faster:
            repeated += turn.total_tokens - turn.named_stop_tokens
        faster.setdefault((name, key), 2.0 ** (1 + len([k for k in faster if k[0] == name])))
    rows = [{"problem": n, "program": k, "correct": True, "speedup": v} for (n, k), v in faster.items()]
    split = named_saving_split(problems, turns, rows, 0.1)
    assert split["not_correct"] == 0.0
    assert split["not_better"] == pytest.approx(repeated / sum(saved.values()))
    # One problem's answers wrong: its turns' share of the saving, no more.
    mixed = [{**r, "correct": r["problem"] != first} for r in rows]
    share = named_saving_split(problems, turns, mixed, 0.1)["not_correct"]
    assert share == pytest.approx(saved[problems[0].name] / sum(saved.values()))
    # Answers all correct at the reference's speed: none beats the reference by the margin.
    flat = [{**r, "speedup": 1.0} for r in rows]
    assert named_saving_split(problems, turns, flat, 0.1) == {"not_correct": 0.0, "not_better": 1.0, "better": 0.0}
    # No margin (BenchConfig.improvement_margin None): the loop ends no turn early on an answer.
    none = named_saving_split(problems, turns, rows, None)
    assert none["better"] == 0.0 and none["not_better"] == pytest.approx(1.0)


def test_an_answers_feedback_is_zero_when_a_draft_already_brought_it(tmp_path: Path) -> None:
    """Each answer's feedback (extracted -> the verdict that ends its evaluation) per job, and its
    median per mode in the report: an answer the job had already submitted as a draft or a fork
    waits for nothing more; sequential, which submits answers only, waits for each new one."""
    measured = Path(__file__).resolve().parents[2] / "tools" / "results" / "bench_virtual_h200.json"
    out = tmp_path / "b"
    assert main(["bench", "--clock", "virtual", "--generate", "8", "--turns", "3", "--concurrency", "8",
                 "--seed", "1", "--devices", ",".join(["cuda:0"] * 8), "--modes", "specgen,sequential",
                 "--measured", str(measured), "--quiet", "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    jobs = [j for j in data["jobs"]]
    by_mode = {m: [s for j in jobs if j["mode"] == m for s in j["answer_feedback_s"]]
               for m in ("specgen", "sequential")}
    # Sequential answers every turn; a new answer waits for its evaluation, a repeated one does not.
    assert len(by_mode["sequential"]) == 24 and all(s >= 0 for s in by_mode["sequential"])
    assert any(s > 0 for s in by_mode["sequential"])
    # Specgen's drafts and forks judged some answers before they were written.
    zeros = {m: sum(s == 0.0 for s in v) for m, v in by_mode.items()}
    assert zeros["specgen"] > zeros["sequential"]
    report = (out / "report.md").read_text()
    assert "answers' feedback p50 s" in report


def test_a_programs_build_is_waited_for_once_per_run(tmp_path: Path) -> None:
    """The measured build seconds are added to a program's first evaluation in each mode's run:
    with a long build every mode's jobs take longer, and by no more than their programs' builds."""
    measured = Path(__file__).resolve().parents[2] / "tools" / "results" / "bench_virtual_h200.json"
    data = json.loads(measured.read_text())
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps({**data, "evaluations": [{**r, "build_s": 40.0} for r in data["evaluations"]]}))
    runs = {}
    for name, path in (("cached", measured), ("built", slow)):
        out = tmp_path / name
        assert main(["bench", "--clock", "virtual", "--generate", "2", "--turns", "1", "--concurrency", "2",
                     "--seed", "1", "--devices", "cuda:0,cuda:0", "--modes", "specgen,sequential",
                     "--measured", str(path), "--quiet", "--out", str(out)]) == 0
        runs[name] = {(j["mode"], j["problem"]): j for j in json.loads((out / "results.json").read_text())["jobs"]}
    assert runs["cached"].keys() == runs["built"].keys()
    for key, job in runs["built"].items():
        before = runs["cached"][key]["end_to_end_s"]
        # An answer's build is on its job's path: no job gets faster, and at least one waits.
        assert job["end_to_end_s"] >= before - 1e-6, key
    assert sum(j["end_to_end_s"] for j in runs["built"].values()) > \
        sum(j["end_to_end_s"] for j in runs["cached"].values()) + 39
