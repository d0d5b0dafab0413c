"""The optimize loop with the replay engine and real CPU evaluation.

The bundled fused_elementwise trace has, in its first iteration, a correct but slow kernel at about
a quarter of the reasoning and a much faster one at about a third; the rest is checking.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from specgen.backend import BackendLoad
from specgen.messages import CandidateSubmission, CandidateUpdate, OptimizeSpec, TriggerSettings, Verdict
from specgen.optimize.fork_prompt import FORK_INSTRUCTION
from specgen.optimize.loop import OptimizeJob, run_job
from specgen.traces.bundled import bundled_problem, bundled_trace
from specgen.traces.format import TraceBuilder
from specgen.traces.pinned_replay import IterationReplayEngine

from .conftest import PROBLEMS, local_backend, run

FUSED = "fused_elementwise"
TORCH_KERNEL = (PROBLEMS / "candidates" / "fused_elementwise_torch.py").read_text()


def fused_spec(mode: str, **kw) -> OptimizeSpec:
    return OptimizeSpec(job_id=f"test-{mode}", problem_name=FUSED,
                        problem_source=bundled_problem(FUSED).read_text(), mode=mode, **kw)


def trace_iteration_tokens(engine: IterationReplayEngine, index: int = 0) -> tuple[int, int]:
    iteration = engine.trace.iterations[index]
    return iteration.reasoning.num_tokens, iteration.final.num_tokens


def test_specgen_stops_the_reasoning_early_and_sequential_reads_it_all(eval_workers) -> None:
    async def go(mode: str):
        # Speed 4, not faster: on a loaded 2-core machine with cold caches a CPU evaluation of a
        # Triton kernel takes 5-12 s, and the reasoning must not outrun its own candidates.
        engine = IterationReplayEngine(bundled_trace(FUSED), speed=4)
        async with local_backend(eval_workers) as backend:
            result = await run_job(fused_spec(mode, max_iterations=1), engine, backend)
        return engine, result

    engine, spec_result = run(go("specgen"))
    reasoning, final = trace_iteration_tokens(engine)
    (iteration,) = spec_result.iterations
    assert spec_result.reasoning[0].finish_reason == "abort"   # it never finished by itself
    assert "early termination" in iteration.stop_reason
    assert iteration.reasoning_tokens < 0.75 * reasoning, (iteration.reasoning_tokens, reasoning)
    # The fast kernel beat the slow one found before it; both were profiled for real.
    correct = [c for c in spec_result.candidates if c.status == "correct"]
    assert len(correct) >= 2 and spec_result.best_speedup == max(c.speedup for c in correct)
    assert spec_result.best_candidate_id != correct[0].candidate_id
    statuses = {c.status for c in spec_result.candidates}
    assert {"incorrect", "correct"} <= statuses        # the wrong kernels came back as failures
    assert spec_result.metrics.forks >= 3 and spec_result.metrics.profiled >= 2

    engine, seq_result = run(go("sequential"))
    (iteration,) = seq_result.iterations
    assert iteration.finish_reason == "stop"
    assert iteration.reasoning_tokens == reasoning + final     # the whole stream, answer included
    assert seq_result.metrics.forks == 0
    (only,) = seq_result.candidates
    assert only.origin == "final" and only.status == "correct"
    assert seq_result.metrics.end_to_end_s > spec_result.metrics.end_to_end_s
    assert seq_result.status == spec_result.status == "iterations_done"


def test_forks_happen_only_at_trigger_points_and_duplicates_are_not_evaluated(eval_workers) -> None:
    cues = ["let me write", "the plan is", "wait"]
    settings = TriggerSettings(structure_boundaries=False, cues=cues, min_gap_tokens=64,
                               max_forks_per_iteration=6, max_forks_in_flight=0)
    spec = fused_spec("specgen", max_iterations=1, early_termination=False, load_aware=False,
                      triggers=settings)

    async def go():
        engine = IterationReplayEngine(bundled_trace(FUSED), speed=12)
        async with local_backend(eval_workers) as backend:
            return engine, await run_job(spec, engine, backend)

    engine, result = run(go())
    reasoning_ids = engine.trace.iterations[0].reasoning.token_ids
    assert 2 <= len(result.forks) <= 6
    previous = 0
    for fork in result.forks:
        trigger, _, cue = fork.trigger.partition(": ")
        assert trigger == "cue" and cue in cues
        # The cue is in the text the fork was taken after (a delta may hold a few more tokens).
        before = engine.decode(reasoning_ids[:fork.position])
        assert cue in " ".join(before[-120:].lower().split()), (cue, before[-120:])
        assert fork.position - previous >= 64
        previous = fork.position
    # Duplicates: recognized, recorded, never sent for evaluation.
    duplicates = [c for c in result.candidates if c.duplicate_of is not None]
    evaluated = [c for c in result.candidates if c.duplicate_of is None]
    assert duplicates, "the trace repeats kernels; some forks must be duplicates"
    assert all(c.validation is None and c.profile is None for c in duplicates)
    assert len({c.fingerprint for c in evaluated}) == len(evaluated)
    assert result.metrics.validated == len(evaluated) == result.metrics.candidates
    assert {d.fingerprint for d in duplicates} <= {c.fingerprint for c in evaluated}


def small_trace(iterations: int, *, reasoning_words: int = 300) -> TraceBuilder:
    """A short trace whose answer is a plain-PyTorch kernel (fast to evaluate on a CPU)."""
    builder = TraceBuilder(token_rate=400, problem=FUSED, ttft_s=0.05, fork_ttft_s=0.02)
    body = "\n\n".join(" ".join(["we check the bias broadcast and the erf form"] * 6)
                       for _ in range(reasoning_words // 48))
    for _ in range(iterations):
        builder.add_iteration(
            "Let me write the plain version first.\n\n" + body,
            forks={"Let me write": TORCH_KERNEL + "```\n"},
            final_text="```python\n" + TORCH_KERNEL + "```\n",
            suffix_text="\n</think>" + FORK_INSTRUCTION)
    return builder


class HeldBackend:
    """An evaluation backend that answers each candidate when the test says: answers (origin
    "final") at once, correct at 1.0x; speculative candidates `speculative_delay_s` after they
    came (never when None). It checks the loop's waits, not the evaluation: the real service is
    tested with the loop everywhere else in this file."""

    def __init__(self, speculative_delay_s: float | None) -> None:
        self.speculative_delay_s = speculative_delay_s
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancelled: list[str] = []

    async def submit(self, candidate: CandidateSubmission) -> None:
        delay = 0.0 if candidate.origin == "final" else self.speculative_delay_s
        if delay is not None:
            asyncio.get_running_loop().call_later(delay, self._answer, candidate)

    def _answer(self, candidate: CandidateSubmission) -> None:
        now = time.time()
        for stage, speedup in (("validate", None), ("profile", 1.0)):
            self.queue.put_nowait(CandidateUpdate(
                job_id=candidate.job_id, candidate_id=candidate.candidate_id, stage=stage,
                verdict=Verdict(compiled=True, correct=True, speedup=speedup), started_at=now,
                finished_at=now))

    async def updates(self):
        while True:
            yield await self.queue.get()

    async def cancel_job(self, job_id: str) -> None:
        self.cancelled.append(job_id)

    def load(self) -> BackendLoad:
        return BackendLoad(validation_workers=1, profiling_workers=1)


SLOW_KERNEL = (PROBLEMS / "candidates" / "slow" / "fused_elementwise_slow.py").read_text()


def forking_trace(fork_program: str, iterations: int = 2) -> IterationReplayEngine:
    """Each iteration forks once near its start (the fork writes `fork_program`) and answers with
    the plain-PyTorch kernel; long enough that the fork ends well before the answer."""
    builder = TraceBuilder(token_rate=400, problem=FUSED, ttft_s=0.05, fork_ttft_s=0.02)
    body = "\n\n".join(" ".join(["we check the bias broadcast and the erf form"] * 6) for _ in range(25))
    for _ in range(iterations):
        builder.add_iteration("Let me write the plain version first.\n\n" + body,
                              forks={"Let me write": fork_program + "```\n"},
                              final_text="```python\n" + TORCH_KERNEL + "```\n",
                              suffix_text="\n</think>" + FORK_INSTRUCTION)
    return IterationReplayEngine(builder.build(), speed=1)


def forking_spec(**kw) -> OptimizeSpec:
    return fused_spec("specgen", **{"max_iterations": 2, **kw}, load_aware=False,
                      triggers=TriggerSettings(structure_boundaries=False, cues=["let me write"],
                                               min_gap_tokens=0, max_forks_in_flight=0))


def test_specgen_waits_for_its_answer_not_for_its_speculation() -> None:
    """The next prompt waits for the answer's verdict only, and the job's end cancels the
    speculative candidates still owed instead of waiting for them."""
    backend = HeldBackend(speculative_delay_s=None)        # forks are never answered
    result = run(asyncio.wait_for(run_job(forking_spec(), forking_trace(SLOW_KERNEL), backend), 60))
    assert result.status == "iterations_done"
    forks = [c for c in result.candidates if c.origin == "fork" and c.duplicate_of is None]
    finals = [c for c in result.candidates if c.origin == "final"]
    assert len(forks) == 1 and forks[0].status == "cancelled"    # iteration 1's fork repeats it
    assert [c.status for c in finals] == ["correct", "duplicate"]
    assert result.iterations[1].started_at >= finals[0].feedback_at
    assert backend.cancelled == [result.job_id]


def test_drain_speculative_waits_for_the_speculative_verdicts() -> None:
    engine = forking_trace(SLOW_KERNEL, iterations=1)
    # The fork's verdict comes a second after the answer's.
    backend = HeldBackend(speculative_delay_s=engine.trace.iterations[0].final.duration_s + 1.0)
    spec = forking_spec(drain_speculative=True, max_iterations=1)
    result = run(asyncio.wait_for(run_job(spec, engine, backend), 60))
    fork, answer = result.candidates
    assert fork.origin == "fork" and answer.origin == "final"
    assert fork.status == "correct" and answer.feedback_at < fork.feedback_at <= result.finished_at


def test_an_answer_a_fork_wrote_first_waits_for_that_forks_verdict() -> None:
    engine = forking_trace(TORCH_KERNEL)
    backend = HeldBackend(speculative_delay_s=engine.trace.iterations[0].final.duration_s + 1.0)
    result = run(asyncio.wait_for(run_job(forking_spec(), engine, backend), 60))
    fork, answer = result.candidates[0], result.candidates[1]
    assert fork.origin == "fork" and answer.origin == "final" and answer.duplicate_of == fork.candidate_id
    assert fork.status == "correct"
    assert result.iterations[1].started_at >= fork.feedback_at


@pytest.mark.parametrize("fenced", [False, True])
def test_a_draft_the_end_of_the_reasoning_completes_is_harvested_at_the_think_end_tag(
        fenced: bool) -> None:
    # The reasoning ends with the program (unfenced, or its closing fence without a newline: only
    # the end of the reasoning completes it), and the answer repeats it.
    draft = f"```python\n{TORCH_KERNEL}```" if fenced else TORCH_KERNEL
    builder = TraceBuilder(token_rate=400, problem=FUSED, ttft_s=0.05)
    body = " ".join(["we check the bias broadcast and the erf form"] * 20)
    builder.add_iteration(f"{body}\n\nLet me write the plain version.\n\n{draft}", forks=[],
                          final_text="```python\n" + TORCH_KERNEL + "```\n")
    engine = IterationReplayEngine(builder.build(), speed=1)
    reasoning, final = trace_iteration_tokens(engine)
    spec = fused_spec("specgen", max_iterations=1, load_aware=False,
                      triggers=TriggerSettings(structure_boundaries=False, cues=["no such cue"]))
    result = run(asyncio.wait_for(run_job(spec, engine, HeldBackend(speculative_delay_s=0.0)), 60))
    draft_record, answer = result.candidates
    assert draft_record.origin == "inline" and answer.origin == "final"
    # Harvested when the tag came (not before: nothing in the reasoning showed the program had
    # ended), ahead of the answer, which is judged by the draft's evaluation.
    assert reasoning < draft_record.position <= reasoning + final
    assert draft_record.extracted_at <= answer.extracted_at
    assert answer.duplicate_of == draft_record.candidate_id


def test_token_budget_is_enforced(eval_workers) -> None:
    engine = IterationReplayEngine(small_trace(3).build(), speed=1)
    spec = fused_spec("sequential", max_iterations=3, token_budget=700)

    async def go():
        async with local_backend(eval_workers) as backend:
            return await run_job(spec, engine, backend)

    result = run(go())
    assert result.status == "token_budget" and "700" in result.stop_reason
    # Enforced per delta: at most one delta past the budget (replay deltas are a few tokens here).
    assert 700 <= result.metrics.total_tokens <= 720
    assert result.iterations[-1].stop_reason.startswith("job stopped")


def test_time_budget_is_enforced(eval_workers) -> None:
    engine = IterationReplayEngine(bundled_trace(FUSED), speed=1)
    spec = fused_spec("specgen", time_budget_s=2.0)

    async def go():
        async with local_backend(eval_workers) as backend:
            began = time.monotonic()
            result = await run_job(spec, engine, backend)
            return result, time.monotonic() - began

    result, elapsed = run(go())
    assert result.status == "time_budget"
    assert 2.0 <= elapsed < 5.0
    assert result.metrics.reasoning_tokens < trace_iteration_tokens(engine)[0]


def test_best_of_n_replays_one_iteration_per_stream_set(eval_workers) -> None:
    engine = IterationReplayEngine(small_trace(2).build(), speed=1)
    spec = fused_spec("best-of-n", max_iterations=2, best_of_n=3)

    async def go():
        async with local_backend(eval_workers) as backend:
            return await run_job(spec, engine, backend)

    result = run(go())
    assert result.status == "iterations_done"
    assert [len(it.request_ids) for it in result.iterations] == [3, 3]
    assert len(result.reasoning) == 6
    # Three samples of one recorded iteration: one program, evaluated once per job.
    evaluated = [c for c in result.candidates if c.duplicate_of is None]
    assert len(evaluated) == 1 and evaluated[0].status == "correct"
    assert len(result.candidates) == 6


def test_pipeline_starts_the_next_iteration_before_the_verdict(eval_workers) -> None:
    engine = IterationReplayEngine(small_trace(2).build(), speed=1)
    spec = fused_spec("pipeline", max_iterations=2)

    async def go():
        async with local_backend(eval_workers) as backend:
            return await run_job(spec, engine, backend)

    result = run(go())
    first = result.candidates[0]
    assert first.origin == "final" and first.status == "correct"
    assert result.iterations[1].started_at < first.feedback_at
    # The last iteration's candidate is waited for before the job ends.
    assert all(c.status in ("correct", "duplicate") for c in result.candidates)


def test_termination_cancels_forks_and_evaluations_in_flight(eval_workers) -> None:
    """Stop the job at a moment with a fork generating, a candidate waiting for validation or
    being validated, and one being profiled; everything must be cancelled, nothing left running."""
    engine = IterationReplayEngine(bundled_trace(FUSED), speed=4)
    # No early termination, and long profiling, so the moment is bound to come.
    spec = fused_spec("specgen", max_iterations=1, early_termination=False, load_aware=False,
                      triggers=TriggerSettings(min_gap_tokens=128, max_forks_in_flight=0,
                                               max_forks_per_iteration=40))
    seen: dict[str, object] = {}

    async def go():
        async with local_backend(eval_workers) as backend:
            job = OptimizeJob(spec, engine, backend)

            def profiling_for_a_second() -> bool:
                # A profile that has really started (not one handed to a worker this instant).
                return any(c.status == "pending" and c.validation is not None
                           and c.validation.finished_at < time.time() - 1.0
                           for c in job.candidates.values())

            def watch(event) -> None:
                p = event.progress
                if p and p.forks_running and p.validating and profiling_for_a_second() \
                        and "at" not in seen:
                    seen["at"] = p
                    job.cancel("test: everything in flight")
                elif event.kind == "reasoning_finished":
                    job.cancel("test: the moment never came")     # fail fast below

            job._emit_fn = watch
            result = await asyncio.wait_for(job.run(), timeout=90)
            # Cancelled work must be gone from the backend promptly.
            for _ in range(50):
                load = await backend.refresh_load()
                if not (load.validation_running or load.profiling_running
                        or load.validation_queued or load.profiling_queued):
                    break
                await asyncio.sleep(0.1)
            return result, load

    from specgen.eval.options import EvalOptions
    # Correctness trials slow enough that the slow kernel is still validating while the fast
    # one, found later, is already profiling.
    slow_profiling = EvalOptions(trials=30, timing_trials=2000, warmup=1, second_shape=False,
                                 randomized_params=False)
    saved = [w.options for w in eval_workers]
    for worker in eval_workers:
        worker.options = slow_profiling
    try:
        result, load = run(go())
    finally:
        for worker, options in zip(eval_workers, saved):
            worker.options = options
    assert "at" in seen, "never had a fork, a validation and a profiling in flight at once"
    assert result.status == "cancelled"
    assert result.reasoning[0].finish_reason == "abort"
    assert any(f.outcome == "aborted" for f in result.forks)
    assert all(f.finished_at is not None for f in result.forks)
    cancelled = [c for c in result.candidates if c.status == "cancelled"]
    assert any(c.validation is not None and c.validation.verdict.correct for c in cancelled), \
        "the candidate being profiled was cancelled"
    assert any(c.validation is None for c in cancelled), "the one awaiting validation too"
    assert not [c for c in result.candidates if c.status == "pending"]
    assert load.validation_running == load.profiling_running == 0
    assert load.validation_queued == load.profiling_queued == 0
    assert engine._requests.ids() == []     # the replay engine serves nothing any more
    assert result.metrics.cancelled == len(cancelled)


def test_an_unreachable_engine_fails_the_job_with_its_message(eval_workers, tiny_model_path) -> None:
    from specgen.engines.openai_http import OpenAICompatEngine

    # Nothing listens on the discard port: the connection is refused at once.
    engine = OpenAICompatEngine("http://127.0.0.1:9/v1", "tiny", tokenizer=tiny_model_path,
                                connect_timeout_s=5)

    async def go():
        async with local_backend(eval_workers) as backend:
            return await run_job(fused_spec("specgen"), engine, backend)

    result = run(go())
    assert result.status == "failed"
    assert "cannot reach the server at http://127.0.0.1:9/v1" in (result.error or "")
    assert result.iterations == [] and result.candidates == []


@pytest.mark.parametrize("mode", ["specgen", "sequential"])
def test_events_tell_the_story(eval_workers, mode: str) -> None:
    engine = IterationReplayEngine(small_trace(1).build(), speed=1)
    events = []

    async def go():
        async with local_backend(eval_workers) as backend:
            return await run_job(fused_spec(mode, max_iterations=1), engine, backend,
                                 events.append)

    result = run(go())
    kinds = [e.kind for e in events]
    assert kinds[0] == "job_started" and kinds[-1] == "job_finished"
    assert "iteration_started" in kinds and "update" in kinds
    assert all(e.job_id == result.job_id and e.progress is not None for e in events)
    assert events[-1].progress.best_speedup == pytest.approx(result.best_speedup)
    assert ("fork_started" in kinds) == (mode == "specgen")


def test_candidate_ids_read_in_order_and_cannot_be_guessed() -> None:
    """Ids are an ordinal and 64 random bits (runtime/ids.py): two runs of the same job share none."""
    import re

    runs = []
    for _ in range(2):
        engine = forking_trace(SLOW_KERNEL, iterations=1)
        backend = HeldBackend(speculative_delay_s=0.0)
        result = run(asyncio.wait_for(run_job(forking_spec(max_iterations=1), engine, backend), 60))
        runs.append([c.candidate_id for c in result.candidates])
    for ids in runs:
        assert len(ids) >= 2 and all(re.fullmatch(r"c\d{3}-[0-9a-f]{16}", i) for i in ids), ids
        assert [i[:4] for i in ids] == [f"c{n:03d}" for n in range(len(ids))]
    assert not {i[5:] for i in runs[0]} & {i[5:] for i in runs[1]}
