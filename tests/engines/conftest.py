"""Session fixtures for engine tests: the tiny model is built once and cached across runs, and one
vLLM engine serves every test that needs it (engine start-up costs 20-60 s on the 2-core CI machine).

Async code runs on one event loop for the whole session (`loop.run(coro)`), because an `AsyncLLM`
is bound to the loop it first streams on.
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Awaitable, Iterator, TypeVar

import pytest

from specgen.engines.tiny_model import build_tiny_model, default_tiny_model_dir

# Nothing may be downloaded in tests; vLLM's CPU engine gets a small KV cache.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

T = TypeVar("T")


class LoopRunner:
    """Runs coroutines on one long-lived event loop, each under a timeout."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, awaitable: Awaitable[T], timeout_s: float = 120.0) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(awaitable, timeout_s))

    def close(self) -> None:
        pending = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()


@pytest.fixture(scope="session")
def loop() -> Iterator[LoopRunner]:
    runner = LoopRunner()
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    """Path of the tiny random-weight Qwen2 (built on first use; `SPECGEN_CACHE_DIR` moves the cache)."""
    return build_tiny_model(default_tiny_model_dir())


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture(scope="session")
def engines_cache_dir() -> Path:
    return default_tiny_model_dir().parent


@pytest.fixture(scope="session")
def tiny_vllm_engine(loop: LoopRunner, tiny_model_path: str) -> Iterator[Any]:
    """A started `VLLMEngine` on the tiny model, shared by every test of the session."""
    from specgen.engines.vllm_engine import VLLMEngine

    # Eager mode: skips torch.compile, which costs more start-up time than these short tests save.
    engine = VLLMEngine(
        tiny_model_path, max_model_len=8192, kv_cache_gib=1, dtype="float32", engine_args={"enforce_eager": True}
    )
    loop.run(engine.start(), timeout_s=600)
    yield engine
    loop.run(engine.close(), timeout_s=120)
