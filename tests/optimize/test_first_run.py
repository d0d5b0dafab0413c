"""The first run: the CPU default problem and its generated trace, and the closing screen."""
from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specgen.engines.base import GenerationParams
from specgen.engines.timing_model import TimingModel
from specgen.eval.loader import load_candidate, load_problem
from specgen.messages import (
    CandidateRecord,
    CandidateUpdate,
    IterationRecord,
    JobMetrics,
    OptimizeResult,
    ReasoningRecord,
    Verdict,
)
from specgen.optimize import first_run
from specgen.optimize.fork_models import fork_writer
from specgen.traces.bundled import (
    DEFAULT_CPU_PROBLEM,
    DEFAULT_PROBLEM,
    bundled_problem,
    bundled_problems,
    bundled_trace,
    default_run,
    generated_trace_path,
)
from specgen.traces.extraction import extract_candidate
from specgen.traces.format import Trace, TraceBuilder
from specgen.traces.modelled import ModelledEngine

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ default problem and trace

def _optimize_args(*argv: str) -> argparse.Namespace:
    from specgen.cli import build_parser

    args = build_parser().parse_args(["optimize", *argv])
    # As run_optimize hands a single run its problem (several make a suite).
    args.problem = args.problem[0] if args.problem else None
    return args


def test_a_cpu_only_host_replays_the_generated_trace_of_the_cpu_problem() -> None:
    from specgen.cli.optimize_job import plan_run as _plan

    plan = _plan(_optimize_args(), gpu=False)
    assert plan.problem_name == DEFAULT_CPU_PROBLEM != DEFAULT_PROBLEM
    assert plan.problem_path == bundled_problem(DEFAULT_CPU_PROBLEM)
    assert plan.trace_path == generated_trace_path(DEFAULT_CPU_PROBLEM) and plan.trace_path.is_file()
    assert "bundled generated (tools/make_traces.py --generated, seed 0) trace" in plan.notice
    # A GPU host keeps the hand-written Triton trace.
    plan = _plan(_optimize_args(), gpu=True)
    assert plan.problem_name == DEFAULT_PROBLEM and plan.trace_path == bundled_trace(DEFAULT_PROBLEM)
    assert "hand-written" in plan.notice
    # A problem named on the command line keeps its own bundled trace on either host.
    plan = _plan(_optimize_args(str(bundled_problem(DEFAULT_PROBLEM))), gpu=False)
    assert plan.trace_path == bundled_trace(DEFAULT_PROBLEM)
    assert default_run(False) == (DEFAULT_CPU_PROBLEM, generated_trace_path(DEFAULT_CPU_PROBLEM))


def test_this_host_picks_by_its_own_gpus() -> None:
    import torch

    from specgen.cli.optimize_job import plan_run as _plan

    plan = _plan(_optimize_args())
    expected = DEFAULT_PROBLEM if torch.cuda.is_available() else DEFAULT_CPU_PROBLEM
    assert plan.problem_name == expected


def test_the_cpu_problem_has_a_native_kernel() -> None:
    assert DEFAULT_CPU_PROBLEM in bundled_problems()
    cpp = REPO / "specgen" / "data" / "problems" / "candidates" / f"{DEFAULT_CPU_PROBLEM}_cpp.py"
    assert "load_inline" in cpp.read_text() or "cpp_extension" in cpp.read_text()


def test_the_generated_trace_loads_and_says_it_is_generated() -> None:
    trace = Trace.load(generated_trace_path(DEFAULT_CPU_PROBLEM))
    meta = trace.metadata
    assert not meta.hand_written and meta.problem == DEFAULT_CPU_PROBLEM
    assert meta.model.startswith("synthetic v") and "seed 0" in meta.model
    assert "tools/make_traces.py --generated" in meta.notes and "seed=0" in meta.notes
    assert "not hand-written" in meta.notes
    assert len(trace.iterations) == 1 and not trace.iterations[0].forks
    # The answer is a real program of the problem (its correctness is the generator's draw).
    answer = extract_candidate(trace.iterations[0].final.text)
    assert answer is not None
    assert load_candidate(answer, load_problem(bundled_problem(DEFAULT_CPU_PROBLEM)))
    # The reasoning has the generator's measured length regime: thousands of tokens.
    assert 1000 <= trace.iterations[0].reasoning.num_tokens <= 24000


def test_the_generated_trace_is_what_the_script_makes() -> None:
    done = subprocess.run([sys.executable, str(REPO / "tools" / "make_traces.py"), "--generated",
                           "--check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "up to date" in done.stdout


# ------------------------------------------------------------------ sequential arithmetic

def _trace(reasoning_words: int, answer: str = "The final version:\n\nno code\n") -> Trace:
    builder = TraceBuilder(token_rate=50, problem="softmax", model="test", hand_written=False)
    builder.add_iteration(" ".join(f"word{i % 50}" for i in range(reasoning_words)), forks=[],
                          final_text=answer)
    return builder.build()


def test_generation_time_is_the_timing_models_whole_reasoning_and_answer() -> None:
    trace = _trace(300)
    it = trace.iterations[0]
    timing = TimingModel(r1=40.0, prefill_tps=1000.0, ttft_floor_s=0.1)
    tokens = it.reasoning.num_tokens + it.final.num_tokens
    assert first_run.generation_s(it, 500, timing) == pytest.approx(0.1 + 500 / 1000 + tokens / 40)
    assert first_run.generation_s(it, 500, timing, speed=4) == pytest.approx(
        (0.1 + 0.5 + tokens / 40) / 4)


def test_generation_time_matches_the_modelled_engines_own_pace() -> None:
    """The figure is what the replay engine takes for the same request alone, measured."""
    trace = _trace(400)
    timing = TimingModel(r1=56.0)
    speed = 16.0
    engine = ModelledEngine(trace, fork_writer("draft"), timing=timing, speed=speed)
    prompt = list(range(1, 201))

    async def replay() -> tuple[int, float]:
        began = time.monotonic()
        count = 0
        async for delta in engine.reason("r0", prompt, GenerationParams(max_tokens=100_000)):
            count += len(delta.token_ids)
        return count, time.monotonic() - began

    count, elapsed = asyncio.run(replay())
    it = trace.iterations[0]
    assert count == it.reasoning.num_tokens + it.final.num_tokens
    expected = first_run.generation_s(it, len(prompt), timing, speed)
    # The engine steps every STEP_S of wall time: within a few steps of the model's figure.
    assert expected == pytest.approx(elapsed, abs=0.15)
    assert expected > 0.5


# ------------------------------------------------------------------ the screen's figures

def _update(cid: str, stage: str, start: float, end: float, correct: bool = True,
            speedup: float | None = None) -> CandidateUpdate:
    return CandidateUpdate(job_id="j", candidate_id=cid, stage=stage, started_at=start,
                           finished_at=end,
                           verdict=Verdict(compiled=True, correct=correct, speedup=speedup))


def _result(trace: Trace, read: int, status: str, *, with_final: bool, end_to_end: float
            ) -> OptimizeResult:
    t0 = 1000.0
    reasoning_end = t0 + 20.0
    candidates = [
        # Judged while the reasoning ran: validated at +5, profiled at +9.
        CandidateRecord(candidate_id="c1", iteration=0, origin="fork", request_id="f1", position=10,
                        fingerprint="a", source="", extracted_at=t0 + 2, status="correct",
                        validation=_update("c1", "validate", t0 + 2, t0 + 5),
                        profile=_update("c1", "profile", t0 + 5, t0 + 9, speedup=1.4)),
        # Validated during the reasoning, profiled after it ended.
        CandidateRecord(candidate_id="c2", iteration=0, origin="fork", request_id="f2", position=20,
                        fingerprint="b", source="", extracted_at=t0 + 15, status="correct",
                        validation=_update("c2", "validate", t0 + 15, t0 + 18),
                        profile=_update("c2", "profile", t0 + 18, t0 + 24, speedup=1.1)),
        # Failed validation: validated, never profiled.
        CandidateRecord(candidate_id="c3", iteration=0, origin="inline", request_id="r", position=5,
                        fingerprint="c", source="", extracted_at=t0 + 1, status="incorrect",
                        validation=_update("c3", "validate", t0 + 1, t0 + 3, correct=False)),
    ]
    if with_final:
        candidates.append(CandidateRecord(
            candidate_id="c4", iteration=0, origin="final", request_id="r", position=read,
            fingerprint="d", source="", extracted_at=reasoning_end + 1, status="correct",
            validation=_update("c4", "validate", reasoning_end + 1, reasoning_end + 4.5),
            profile=_update("c4", "profile", reasoning_end + 4.5, reasoning_end + 7.0, speedup=1.2)))
    return OptimizeResult(
        job_id="j", problem_name="softmax", mode="specgen", status=status, best_speedup=1.4,
        cpu_timing=True,
        iterations=[IterationRecord(index=0, started_at=t0, prompt_tokens=300,
                                    reasoning_tokens=read, reasoning_finished_at=reasoning_end)],
        reasoning=[ReasoningRecord(request_id="r", iteration=0, started_at=t0,
                                   finished_at=reasoning_end, tokens=read)],
        candidates=candidates, metrics=JobMetrics(end_to_end_s=end_to_end))


def test_a_run_that_stopped_early_shows_the_saving_against_sequential() -> None:
    trace = _trace(2000)
    total = trace.iterations[0].reasoning.num_tokens
    timing = TimingModel()
    result = _result(trace, read=total // 4, status="target_reached", with_final=False,
                     end_to_end=30.0)
    # The answer was never written: measured after the run (here: a stated 6.5 s).
    fig = first_run.figures(result, trace, timing, best_kernel="out/best_kernel.py",
                            measured_after={0: 6.5})
    gen = first_run.generation_s(trace.iterations[0], 300, timing)
    assert fig.stopped_early and fig.read_tokens == total // 4 and fig.turn_tokens == total
    assert fig.generation_s == pytest.approx(gen)
    assert fig.sequential_s == pytest.approx(gen + 6.5)
    assert fig.saving_s == pytest.approx(gen + 6.5 - 30.0)
    assert fig.ratio == pytest.approx((gen + 6.5) / 30.0)
    assert (fig.validated, fig.profiled, fig.validated_during, fig.profiled_during) == (3, 2, 3, 1)
    screen = "\n".join(first_run.render(fig))
    assert "out/best_kernel.py, 1.40x the reference (CPU timing)" in screen
    assert f"stopped early, {total // 4:,} of {total:,} tokens read (25%)" in screen
    assert "This run: 30.0 s" in screen
    assert f"{gen + 6.5:.1f} s = {gen:.1f} s reasoning and answer + 6.5 s" in screen
    assert "answer 1: measured after the run" in screen
    assert (f"Saved: {gen + 6.5 - 30.0:.1f} s against sequential ({(gen + 6.5) / 30.0:.2f}x as fast)"
            in screen.splitlines())
    assert "3 validated, 2 profiled; 3 validated and 1 profiled while the reasoning" in screen


def test_a_run_that_ran_to_the_end_saved_nothing_and_says_so() -> None:
    trace = _trace(2000)
    total = trace.iterations[0].reasoning.num_tokens
    timing = TimingModel()
    gen = first_run.generation_s(trace.iterations[0], 300, timing)
    result = _result(trace, read=total, status="iterations_done", with_final=True,
                     end_to_end=gen + 7.5)
    fig = first_run.figures(result, trace, timing, best_kernel="k.py")
    assert not fig.stopped_early
    # The run's own measurement of its answer: validate 3.5 s + profile 2.5 s.
    assert fig.service_s == pytest.approx(6.0)
    assert fig.answers[0].how == "measured in the run"
    assert fig.saving_s == pytest.approx(-1.5)
    screen = "\n".join(first_run.render(fig))
    assert f"ran to the end ({total:,} tokens)" in screen
    assert "Saved: nothing; this run took 1.5 s longer than sequential (" in screen
    assert (fig.validated, fig.profiled) == (4, 3)


def test_an_unmeasured_answer_or_a_live_engine_gives_no_saving() -> None:
    trace = _trace(2000)
    total = trace.iterations[0].reasoning.num_tokens
    result = _result(trace, read=total // 2, status="time_budget", with_final=False,
                     end_to_end=30.0)
    fig = first_run.figures(result, trace, TimingModel())
    assert fig.sequential_s is None and fig.saving_s is None
    screen = "\n".join(first_run.render(fig))
    assert "unmeasured: the run did not evaluate it" in screen
    assert "Saved: unmeasured" in screen
    live = first_run.figures(result, None, None)
    assert "Sequential: not modelled" in "\n".join(first_run.render(live))


def test_a_final_answer_that_duplicates_a_fork_is_timed_by_the_fork() -> None:
    trace = _trace(500)
    result = _result(trace, read=trace.iterations[0].reasoning.num_tokens,
                     status="iterations_done", with_final=False, end_to_end=10.0)
    result.candidates.append(CandidateRecord(
        candidate_id="c5", iteration=0, origin="final", request_id="r", position=1,
        fingerprint="a", source="", extracted_at=0.0, duplicate_of="c1", status="duplicate"))
    assert first_run.answer_service_s(result, 0) == pytest.approx(7.0)   # c1: 3 + 4


def test_measuring_an_unwritten_answer_runs_it_for_real(tmp_path) -> None:
    problem = bundled_problem("softmax")
    program = (REPO / "specgen" / "data" / "problems" / "candidates" / "softmax_torch.py").read_text()
    trace = _trace(300, answer=f"The final version:\n\n```python\n{program}```\n")
    result = _result(trace, read=100, status="target_reached", with_final=False, end_to_end=5.0)
    programs = first_run.unevaluated_answers(result, trace)
    assert list(programs) == [0] and "class ModelNew" in programs[0]
    times = first_run.measure_answers(programs, "softmax", problem.read_text(), "cpu",
                                      {"trials": 2, "timing_trials": 3})
    assert times[0] is not None and times[0] > 0


def _saving(run_s: float, sequential_s: float, stopped_early: bool) -> str:
    fig = first_run.FirstRunFigures(best_kernel=None, best_speedup=None, cpu_timing=True,
                                    turn_tokens=1000, read_tokens=500 if stopped_early else 1000,
                                    stopped_early=stopped_early, run_s=run_s, generation_s=None,
                                    clock="virtual", sequential_run_s=sequential_s)
    return first_run.saving_line(fig)


def test_the_saving_line_reads_as_a_person_would_say_it() -> None:
    # Stopped early and faster: the seconds saved, and how many times as fast.
    assert _saving(30.0, 42.3, True) == "Saved: 12.3 s against sequential (1.41x as fast)"
    # Slower: how much longer, never a negative saving.
    assert _saving(351.3, 350.8, False) == ("Saved: nothing; this run took 0.5 s longer than "
                                            "sequential (1.00x as fast)")
    assert _saving(40.0, 38.0, True) == ("Saved: nothing; this run took 2.0 s longer than "
                                         "sequential (0.95x as fast)")
    # A difference that prints as 0.0 s is none (no "-0.0").
    assert _saving(100.02, 100.0, False) == "Saved: nothing; this run took as long as sequential (1.00x as fast)"
    # Faster with the reasoning read to the end: said where the time came from.
    line = _saving(350.7, 380.3, False)
    assert line.startswith("Saved: 29.6 s against sequential (1.08x as fast); the reasoning ran to "
                           "the end")
    assert "-" not in line
