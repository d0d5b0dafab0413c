"""Fixtures for trace tests: the engine tests' session fixtures (one event loop, the tiny model and
its tokenizer, a tiny vLLM engine for recording a live one) and where the bundled trace sources are."""
from __future__ import annotations

from pathlib import Path

from tests.engines.conftest import loop, tiny_model_path, tiny_tokenizer, tiny_vllm_engine  # noqa: F401  (fixtures)

TRACE_SOURCES = Path(__file__).resolve().parents[2] / "specgen" / "data" / "traces" / "sources"
