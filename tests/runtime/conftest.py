"""Shared pieces of the runtime tests: real problems and candidates, settings, process checks."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import pytest

from specgen.runtime.settings import RuntimeSettings

PROBLEMS = Path(__file__).resolve().parents[2] / "specgen" / "data" / "problems"

SLOW_CORRECT = '''import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Correct, but each call waits first: long enough to be interrupted mid-evaluation."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.4)
        return torch.softmax(x, dim=-1)
'''

WRONG = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0
'''


@pytest.fixture(scope="session")
def softmax_problem() -> str:
    return (PROBLEMS / "softmax.py").read_text()


@pytest.fixture(scope="session")
def softmax_candidate() -> str:
    return (PROBLEMS / "candidates" / "softmax_torch.py").read_text()


def quick_eval_settings(**overrides: object) -> RuntimeSettings:
    """Real evaluations with few trials (this is about the runtime, not about timing quality)."""
    base: dict[str, object] = dict(
        eval_options={"trials": 2, "timing_trials": 3, "warmup": 1,
                      "second_shape": False, "randomized_params": False},
        heartbeat_interval_s=0.25, peer_timeout_s=3.0, shutdown_grace_s=3.0,
        worker_restart_backoff_s=0.2, call_timeout_s=120.0,
    )
    base.update(overrides)
    return RuntimeSettings(**base).check()  # type: ignore[arg-type]


def processes_in_groups(pgids: set[int]) -> list[int]:
    """Live (not zombie) processes whose process group is one of `pgids`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp in pgids and state != "Z":
            found.append(int(entry))
    return found


def _ppids() -> dict[int, int]:
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z":
                table[int(entry)] = int(fields[1])
    return table


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (children, grandchildren, ...)."""
    table = _ppids()
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in table.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    table = _ppids()
    return {p for p in pids if p in table}


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A runtime test that hangs fails on its own, well inside the suite's budget.
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(240))
