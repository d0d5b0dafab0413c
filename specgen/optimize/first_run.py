"""The closing screen of `specgen optimize`: what the run found, and what speculation saved.

Set against a *sequential* run of the same trace on the virtual clock: the timing model's time
for the whole reasoning and the answer of each iteration the run ran (the pacing the modelled
replay engine uses: time to the first token for the prompt, then every reasoning and answer token
at the decode rate of one running sequence), plus the measured validate + profile service time
of that iteration's final answer. The answer's service time is the run's own measurement when the
run evaluated it; when the run stopped the reasoning before the answer was written, the answer is
evaluated once after the run (`measure_answers`) for that figure, or the figure is said to be
unmeasured. Nothing here is estimated from the run itself: the saving is sequential's time less
this run's, said as a person would say it (`saving_line`). A run that read its reasoning to the end
can still end sooner than sequential (its answer's program was judged, built included, while the
reasoning ran), and the line says that this is where the time came from.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from specgen.engines.timing_model import TimingModel
from specgen.messages import CandidateRecord, CandidateSubmission, OptimizeResult
from specgen.traces.format import Iteration, Trace


def generation_s(iteration: Iteration, prompt_tokens: int, timing: TimingModel,
                 speed: float = 1.0) -> float:
    """The timing model's time for one whole iteration of a trace run alone: prefill of the
    prompt, then its reasoning and its answer at one running sequence's decode rate."""
    tokens = iteration.reasoning.num_tokens + iteration.final.num_tokens
    return (timing.ttft_s(prompt_tokens) + tokens / timing.decode_tps(1)) / speed


def _trace_iteration(trace: Trace, index: int) -> Iteration:
    # The replay engine repeats the last iteration when a run asks for more (extra_iterations).
    return trace.iterations[min(index, len(trace.iterations) - 1)]


def _service_s(candidate: CandidateRecord) -> float | None:
    """Measured validate + profile time of one candidate (None: it was not evaluated)."""
    updates = [u for u in (candidate.validation, candidate.profile) if u is not None]
    if candidate.profile is not None and candidate.profile is candidate.validation:
        updates = [candidate.profile]
    seen, total = set(), 0.0
    for update in updates:
        if update.cancelled or update.finished_at <= 0:
            return None
        key = (update.stage, update.started_at, update.finished_at)
        if key not in seen:
            seen.add(key)
            total += max(0.0, update.finished_at - update.started_at)
    return total if seen else None


def answer_service_s(result: OptimizeResult, iteration: int) -> float | None:
    """The run's measured service time of iteration `iteration`'s final answer (or of the earlier
    candidate it duplicates), None when the run did not evaluate it."""
    by_id = {c.candidate_id: c for c in result.candidates}
    for candidate in result.candidates:
        if candidate.origin != "final" or candidate.iteration != iteration:
            continue
        if candidate.duplicate_of:
            original = by_id.get(candidate.duplicate_of)
            return _service_s(original) if original is not None else None
        return _service_s(candidate)
    return None


@dataclass
class Answer:
    """An iteration's final answer as the sequential run would have it judged."""

    iteration: int
    service_s: float | None
    how: str                       # "measured in the run" | "measured after the run" | "unmeasured: ..."


@dataclass
class FirstRunFigures:
    best_kernel: str | None        # the file the best kernel was written to
    best_speedup: float | None
    cpu_timing: bool
    turn_tokens: int               # the reasoning of the iterations run, in the trace
    read_tokens: int               # of which the run read before it stopped them
    stopped_early: bool
    run_s: float                   # this run, end to end
    generation_s: float | None     # sequential: the timing model's time for reasoning + answers
    answers: list[Answer] = field(default_factory=list)
    validated: int = 0
    profiled: int = 0
    validated_during: int = 0      # verdicts that came while their iteration's reasoning ran
    profiled_during: int = 0
    clock: str = "wall"            # "virtual": the run and sequential simulated on measured verdicts
    sequential_run_s: float | None = None   # sequential's simulated run (virtual clock)
    measured_programs: int = 0     # virtual clock: programs evaluated for real, and the time it took
    measured_wall_s: float = 0.0
    no_evidence: str | None = None # why no comparison is claimed (too few answers judged here)

    @property
    def service_s(self) -> float | None:
        if not self.answers or any(a.service_s is None for a in self.answers):
            return None
        return sum(a.service_s for a in self.answers)   # type: ignore[misc]

    @property
    def sequential_s(self) -> float | None:
        if self.sequential_run_s is not None:
            return self.sequential_run_s
        if self.generation_s is None or self.service_s is None:
            return None
        return self.generation_s + self.service_s

    @property
    def saving_s(self) -> float | None:
        return None if self.sequential_s is None else self.sequential_s - self.run_s

    @property
    def ratio(self) -> float | None:
        if self.sequential_s is None or not self.run_s > 0:
            return None
        return self.sequential_s / self.run_s


def figures(result: OptimizeResult, trace: Trace | None, timing: TimingModel | None,
            speed: float = 1.0, best_kernel: str | Path | None = None,
            measured_after: dict[int, float | None] | None = None) -> FirstRunFigures:
    """The screen's figures. `trace` and `timing`: what the run replayed at which pace (None: a
    live engine, no sequential figure). `measured_after`: service times of answers the run did not
    evaluate, measured after it (iteration -> seconds, None where that failed)."""
    measured_after = measured_after or {}
    turn = read = 0
    stopped = False
    gen: float | None = 0.0 if trace is not None and timing is not None else None
    answers = []
    for record in result.iterations:
        if trace is not None:
            it = _trace_iteration(trace, record.index)
            turn += it.reasoning.num_tokens
            read += min(record.reasoning_tokens, it.reasoning.num_tokens)
            stopped = stopped or record.reasoning_tokens < it.reasoning.num_tokens
            if gen is not None:
                gen += generation_s(it, record.prompt_tokens, timing, speed)   # type: ignore[arg-type]
        service = answer_service_s(result, record.index)
        if service is not None:
            answers.append(Answer(record.index, service, "measured in the run"))
        elif record.index in measured_after and measured_after[record.index] is not None:
            answers.append(Answer(record.index, measured_after[record.index],
                                  "measured after the run"))
        else:
            answers.append(Answer(record.index, None, "unmeasured: the run did not evaluate it"))
    ends = {r.iteration: r.finished_at for r in result.reasoning if r.finished_at is not None}
    for record in result.iterations:
        end = record.reasoning_finished_at or record.finished_at
        if end is not None:
            ends[record.index] = max(ends.get(record.index, 0.0), end)
    fig = FirstRunFigures(
        best_kernel=str(best_kernel) if best_kernel is not None else None,
        best_speedup=result.best_speedup, cpu_timing=result.cpu_timing,
        turn_tokens=turn, read_tokens=read, stopped_early=stopped,
        run_s=result.metrics.end_to_end_s, generation_s=gen, answers=answers)
    for c in result.candidates:
        end = ends.get(c.iteration)
        # A "full" update validated and profiled in one: it counts as both.
        validation = c.validation or (c.profile if c.profile is not None
                                      and c.profile.stage == "full" else None)
        if validation is not None and not validation.cancelled:
            fig.validated += 1
            fig.validated_during += end is not None and validation.finished_at < end
        if c.profile is not None and not c.profile.cancelled:
            fig.profiled += 1
            fig.profiled_during += end is not None and c.profile.finished_at < end
    return fig


def unevaluated_answers(result: OptimizeResult, trace: Trace) -> dict[int, str]:
    """iteration -> the trace's final answer program, for the iterations whose answer the run
    did not evaluate (it stopped their reasoning first); an answer without a program is left out
    (judging it would take no time: its sequential service time is 0)."""
    from specgen.traces.extraction import extract_candidate

    programs = {}
    for record in result.iterations:
        if answer_service_s(result, record.index) is None:
            program = extract_candidate(_trace_iteration(trace, record.index).final.text)
            if program is not None:
                programs[record.index] = program
    return programs


def measure_answers(programs: dict[int, str], problem_name: str, problem_source: str,
                    device: str = "cpu", eval_options: dict | None = None
                    ) -> dict[int, float | None]:
    """Validate and profile each program once on a fresh evaluation worker (as the sequential run
    would, the build included); its wall time, or None when the evaluation could not run."""
    from specgen.eval.evaluator import EvalWorker
    from specgen.eval.options import EvalOptions

    times: dict[int, float | None] = {}
    if not programs:
        return times
    with tempfile.TemporaryDirectory(prefix="specgen-first-run-") as scratch:
        with EvalWorker(device, Path(scratch) / "worker", options=EvalOptions(**(eval_options or {})),
                        name=f"first-run/{device}") as worker:
            if worker.refuses_candidates:        # no sandbox here: nothing can be measured
                return {index: None for index in programs}
            for index, program in programs.items():
                submission = CandidateSubmission(
                    job_id="", candidate_id=f"answer-{index}", problem_name=problem_name,
                    problem_source=problem_source, candidate_source=program, iteration=index)
                began = time.monotonic()
                verdict = worker.run(submission, "full")
                # A fresh worker's first take may wait for its spare runner, which a running
                # worker has ready: that wait is not the answer's service time.
                spent = time.monotonic() - began - verdict.stage_seconds.get("spare_wait", 0.0)
                times[index] = max(0.0, spent)
    return times


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def saving_line(fig: FirstRunFigures) -> str:
    """The saving against sequential in plain words: the seconds one way or the other, then how
    many times as fast this run was (sequential's time over this run's)."""
    if fig.no_evidence is not None:
        return "Saved: not claimed (nothing measured here backs a comparison)"
    if fig.saving_s is None or fig.ratio is None:
        return "Saved: unmeasured (no sequential figure)"
    # Rounded as printed, so that a difference shown as 0.0 s is said to be none (and no "-0.0").
    seconds = round(fig.saving_s, 1) + 0.0
    times = f"{fig.ratio:.2f}x as fast"
    if seconds < 0:
        return f"Saved: nothing; this run took {-seconds:.1f} s longer than sequential ({times})"
    if seconds == 0:
        return f"Saved: nothing; this run took as long as sequential ({times})"
    line = f"Saved: {seconds:.1f} s against sequential ({times})"
    if fig.turn_tokens and not fig.stopped_early:
        # Not by stopping the reasoning: the run's verdicts (its answer's, when a draft or fork
        # had the same program) came while the reasoning still ran, where sequential waits for them.
        line += "; the reasoning ran to the end, the time came from verdicts that were in sooner"
    return line


def render(fig: FirstRunFigures) -> list[str]:
    """The screen, as lines of plain text."""
    lines = []
    if fig.best_speedup is not None:
        timing = " (CPU timing)" if fig.cpu_timing else ""
        lines.append(f"Best kernel: {fig.best_kernel or '(not written)'}, "
                     f"{fig.best_speedup:.2f}x the reference{timing}")
    else:
        lines.append("Best kernel: none correct")
    if not fig.turn_tokens:
        lines.append("Reasoning: not from a trace (its length is unknown here)")
    elif fig.stopped_early:
        lines.append(f"Reasoning: stopped early, {fig.read_tokens:,} of {fig.turn_tokens:,} "
                     f"tokens read ({_share(fig.read_tokens, fig.turn_tokens)})")
    else:
        lines.append(f"Reasoning: ran to the end ({fig.turn_tokens:,} tokens)")
    if fig.clock == "virtual":
        lines.append(f"This run (virtual clock): {fig.run_s:.1f} s, on the verdicts and service "
                     f"times of {fig.measured_programs} program(s) evaluated for real in "
                     f"{fig.measured_wall_s:.0f} s")
    else:
        lines.append(f"This run: {fig.run_s:.1f} s")
    if fig.no_evidence is not None:
        lines.append(f"Sequential, same trace (virtual clock): not compared: {fig.no_evidence}")
    elif fig.sequential_run_s is not None:
        lines.append(f"Sequential, same trace (virtual clock): {fig.sequential_run_s:.1f} s (the "
                     "reasoning to its end, each answer judged before the next turn, on the same "
                     "verdicts)")
    elif fig.generation_s is None:
        lines.append("Sequential: not modelled (a live engine: no trace to time)")
    else:
        hows = "; ".join(f"answer {a.iteration + 1}: {a.how}" for a in fig.answers) or "no answer"
        if fig.sequential_s is None:
            lines.append(f"Sequential, same trace (virtual clock): {fig.generation_s:.1f} s of "
                         f"reasoning and answer + the answer's validate+profile, unmeasured "
                         f"({hows})")
        else:
            lines.append(f"Sequential, same trace (virtual clock): {fig.sequential_s:.1f} s = "
                         f"{fig.generation_s:.1f} s reasoning and answer + {fig.service_s:.1f} s "
                         f"validate+profile of the answer ({hows})")
    lines.append(saving_line(fig))
    lines.append(f"Evaluations: {fig.validated} validated, {fig.profiled} profiled; "
                 f"{fig.validated_during} validated and {fig.profiled_during} profiled while the "
                 f"reasoning was still running")
    return lines


def show(lines: list[str], stream) -> None:
    """Print the screen to `stream`, boxed by rich when it is there."""
    try:
        from rich.console import Console
        from rich.panel import Panel
        from rich.text import Text
    except ImportError:
        print("\n".join(["", "== specgen optimize: first run ==", *lines]), file=stream)
        return
    Console(file=stream, width=100, soft_wrap=False).print(
        Panel(Text("\n".join(lines)), title="specgen optimize", expand=False))
