"""Timing statistics and the CPU timing path."""
from __future__ import annotations

import time

import pytest

from specgen.eval.timing import Timer, counted_time, summarize


def test_summary_is_median_and_interquartile_spread() -> None:
    stats = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert stats.median_ms == 3.0 and stats.p25_ms == 2.0 and stats.p75_ms == 4.0
    assert stats.spread == pytest.approx(2.0 / 3.0) and stats.samples == 5


def test_cpu_timer_measures_the_call_and_rotates_inputs() -> None:
    seen: list[int] = []

    def work(inputs: list[int]) -> None:
        seen.append(inputs[0])
        time.sleep(0.002)

    stats = Timer("cpu", l2_flush_mb=8).time(work, [[0], [1], [2]], warmup=2, trials=7)
    assert seen == [0, 1, 0, 1, 2, 0, 1, 2, 0]  # warm-ups, then every set in turn
    assert stats.samples == 6  # the first timed call is dropped
    assert 1.9 < stats.median_ms < 20


def test_gpu_trial_time_is_the_event_time_unless_hidden_work_shows() -> None:
    # 20 us of host sync latency: a wall time within latency + margin is host noise
    assert counted_time(event_ms=1.0, wall_ms=1.06, sync_latency_ms=0.02) == 1.0
    # the device stayed busy 3 ms past the end event (a side stream): that time counts
    assert counted_time(event_ms=0.01, wall_ms=3.02, sync_latency_ms=0.02) == pytest.approx(3.0)
