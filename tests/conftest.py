"""Shared test setup: GPU and vLLM markers skip with a reason where the machine lacks them."""
from __future__ import annotations

import importlib.util

import pytest


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpus = _cuda_devices()
    has_vllm = importlib.util.find_spec("vllm") is not None
    for item in items:
        if "gpu" in item.keywords and gpus < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; run on the GPU machine"))
        if "gpu2" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason="needs two CUDA GPUs with peer access"))
        if "vllm" in item.keywords and not has_vllm:
            item.add_marker(pytest.mark.skip(reason="vLLM is not installed (make install-vllm)"))
    # The multi-host tests (their own nodes, over TCP) run first. After the whole evaluation
    # suite, tests/runtime/test_multi_host.py's killed-node job hung in two full runs, while it
    # passed alone, with the rest of tests/runtime, and after test_sandbox, test_evaluator or
    # test_library; the interaction (most likely with test_red_team) is not yet found.
    items.sort(key=lambda item: item.nodeid.split("::")[0] != "tests/runtime/test_multi_host.py")
