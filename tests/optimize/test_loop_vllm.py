"""The whole optimize loop on vLLM's real engine (CPU build) with the tiny random-weight model.

The tiny model writes random text, so every kernel it produces fails evaluation: what matters is
that the loop runs end to end on a live engine, that the failures come back as feedback in the next
iteration's prompt, and that forks reuse the reasoning's KV cache blocks.
"""
from __future__ import annotations

import asyncio

import pytest

from specgen.messages import OptimizeSpec, TriggerSettings
from specgen.optimize.loop import run_job
from specgen.traces.bundled import bundled_problem

from .conftest import local_backend

pytestmark = pytest.mark.vllm


def test_whole_loop_on_vllm_with_feedback_and_prefix_cache(tiny_model_path, eval_workers) -> None:
    from specgen.engines.vllm_engine import VLLMEngine

    spec = OptimizeSpec(
        job_id="vllm-tiny", problem_name="fused_elementwise",
        problem_source=bundled_problem("fused_elementwise").read_text(), mode="specgen",
        max_iterations=2, reasoning_max_tokens=400, fork_max_tokens=32, temperature=0.0,
        triggers=TriggerSettings(every_n_tokens=160, structure_boundaries=False, cues=[],
                                 min_gap_tokens=160, max_forks_per_iteration=2,
                                 max_forks_in_flight=0))

    async def go():
        engine = VLLMEngine(tiny_model_path, max_model_len=8192, kv_cache_gib=1, dtype="float32")
        try:
            async with local_backend(eval_workers) as backend:
                return await asyncio.wait_for(run_job(spec, engine, backend), timeout=600)
        finally:
            await engine.close()

    result = asyncio.run(go())
    assert result.status == "iterations_done", result.error
    assert [it.finish_reason for it in result.iterations] == ["length", "length"]
    assert result.metrics.reasoning_tokens == 2 * 400
    # Forks at 160 and 320 reasoning tokens in each iteration, each its own live generation.
    assert [(f.iteration, f.position) for f in result.forks] == \
        [(0, 160), (0, 320), (1, 160), (1, 320)]
    assert all(f.tokens == 32 and f.finish_reason == "length" for f in result.forks)
    # Forks were served from the prefix cache: the prompt and reasoning blocks already computed.
    for fork in result.forks:
        assert fork.prompt_tokens is not None and fork.cached_tokens is not None
        assert fork.cached_tokens >= 128, fork
        assert fork.cached_tokens <= fork.prompt_tokens
    # Random text fails evaluation, and that failure is in the next iteration's prompt.
    first = [c for c in result.candidates if c.iteration == 0 and c.duplicate_of is None]
    assert first and all(c.status == "failed" for c in first)
    second_prompt = result.iterations[1].prompt
    for candidate in first:
        assert candidate.candidate_id in second_prompt
    assert "failed to load or compile" in second_prompt
    assert result.iterations[1].prompt_tokens > result.iterations[0].prompt_tokens
    assert result.best_candidate_id is None and result.best_source is None


def test_fork_model_on_a_live_engine_closes_the_loop(tiny_model_path, eval_workers) -> None:
    """Replayed reasoning, forks written by vLLM from the actual fork prompt (--fork-model model)."""
    from specgen.engines.vllm_engine import VLLMEngine
    from specgen.optimize.fork_models import EngineWriter
    from specgen.traces.bundled import bundled_trace
    from specgen.traces.pinned_replay import IterationModelledEngine

    spec = OptimizeSpec(
        job_id="fork-model-live", problem_name="fused_elementwise",
        problem_source=bundled_problem("fused_elementwise").read_text(), mode="specgen",
        max_iterations=1, fork_max_tokens=32, temperature=0.0,
        triggers=TriggerSettings(every_n_tokens=2000, structure_boundaries=False, cues=[],
                                 min_gap_tokens=2000, max_forks_per_iteration=2,
                                 max_forks_in_flight=0))

    async def go():
        live = VLLMEngine(tiny_model_path, max_model_len=8192, kv_cache_gib=1, dtype="float32")
        await live.start()
        writer = EngineWriter(live, max_tokens=32)
        engine = IterationModelledEngine(bundled_trace("fused_elementwise"), writer, speed=20.0)
        try:
            async with local_backend(eval_workers) as backend:
                result = await asyncio.wait_for(run_job(spec, engine, backend), timeout=600)
        finally:
            await live.close()
        return result, writer

    result, writer = asyncio.run(go())
    assert result.status in ("iterations_done", "target_reached"), result.error
    assert result.metrics.forks >= 1 and writer.calls == result.metrics.forks
