"""Session fixtures for engine tests: the tiny model is built once and cached across runs."""
from __future__ import annotations

from pathlib import Path

import pytest

from specgen.engines.tiny_model import build_tiny_model, default_tiny_model_dir


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    """Path of the tiny random-weight Qwen2 (built on first use; `SPECGEN_CACHE_DIR` moves the cache)."""
    return build_tiny_model(default_tiny_model_dir())


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture(scope="session")
def engines_cache_dir() -> Path:
    return default_tiny_model_dir().parent
