"""Timing a model the way the verdict reports it.

On a GPU, for each timed call: the L2 cache is flushed (a buffer larger than L2 is overwritten),
the device is synchronized, a short GPU busy-wait is queued, then a start event, the model's call
on the next of several input sets (rotated, so a result cached from the previous call is never the
right one), an end event on the same stream, and then the whole device is synchronized. The
busy-wait (a "pre-roll", sized from the call's own host enqueue time) keeps the GPU occupied while
the host enqueues the call, so the events bracket the call's GPU execution only: the host's launch
latency, which differs from one process to the next and with whatever else runs on the CPUs, stays
out of the sample (the same idea as nvbench's blocking kernel). The device-wide synchronize gives
a second, host-side measure that also covers work the candidate left on side streams or other
threads; when it exceeds the event time (plus the pre-roll) by more than the host's own sync
latency, measured with no work between, plus a margin, that trial's time is the host-side one, so
hidden work is counted (the validation guards reject such candidates outright as well). The first
timed call is dropped; the median and the spread (p75 - p25) / median are reported.

On the CPU the same sequence runs with `time.perf_counter` and a flush of a 64 MiB buffer; such a
timing says nothing about a GPU, and verdicts mark it `cpu_timing`.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence


@dataclass
class TimingStats:
    median_ms: float
    p25_ms: float
    p75_ms: float
    min_ms: float
    samples: int

    @property
    def spread(self) -> float:
        return (self.p75_ms - self.p25_ms) / self.median_ms if self.median_ms > 0 else 0.0


def summarize(samples_ms: Sequence[float]) -> TimingStats:
    ordered = sorted(samples_ms)
    if len(ordered) >= 4:
        q = statistics.quantiles(ordered, n=4, method="inclusive")
        p25, p75 = q[0], q[2]
    else:
        p25, p75 = ordered[0], ordered[-1]
    return TimingStats(median_ms=statistics.median(ordered), p25_ms=p25, p75_ms=p75,
                       min_ms=ordered[0], samples=len(ordered))


def counted_time(event_ms: float, wall_ms: float, sync_latency_ms: float) -> float:
    """One trial's time: the events' GPU-clock time, unless the host saw the device busy for
    clearly longer (work outside the current stream), in which case that longer time counts."""
    margin = max(0.05, 2.0 * sync_latency_ms)
    if wall_ms - sync_latency_ms > event_ms + margin:
        return wall_ms - sync_latency_ms
    return event_ms


class Timer:
    """Times callables on one device; owns the L2-flush buffer and the sync-overhead estimate."""

    def __init__(self, device: str, l2_flush_mb: int) -> None:
        import torch

        self.device = device
        self.cuda = device.startswith("cuda")
        flush_mb = l2_flush_mb if self.cuda else min(l2_flush_mb, 64)
        self._flush = torch.empty(flush_mb * 1024 * 1024, dtype=torch.uint8, device=device)
        self._overhead_ms = self._measure_overhead() if self.cuda else 0.0
        self.hidden_work_trials = 0  # trials of the last `time` counted by the host-side measure

    def flush(self) -> None:
        self._flush.add_(1)  # a read-modify-write of the whole buffer evicts other lines

    def _measure_overhead(self) -> float:
        """Host-side latency of record-start, record-end, device synchronize with no work."""
        import torch

        samples = []
        for _ in range(25):
            torch.cuda.synchronize()
            began = time.perf_counter()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            end.record()
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - began) * 1e3)
        return statistics.median(samples[5:])

    def time(self, fn: Callable[[Any], Any], input_sets: Sequence[Any], warmup: int,
             trials: int) -> TimingStats:
        """Time `fn(inputs)` over `trials` calls (first dropped), rotating `input_sets`."""
        import torch

        count = len(input_sets)
        with torch.no_grad():
            enqueue_ms = []
            for index in range(max(warmup, 1 if self.cuda else 0)):
                self._sync()
                began = time.perf_counter()
                fn(input_sets[index % count])
                enqueue_ms.append((time.perf_counter() - began) * 1e3)
            self._sync()
            if self.cuda:
                preroll_cycles = self._preroll_cycles(statistics.median(enqueue_ms))
            samples: list[float] = []
            self.hidden_work_trials = 0
            for index in range(trials):
                inputs = input_sets[index % count]
                self.flush()
                if self.cuda:
                    pre = torch.cuda.Event(enable_timing=True)
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    torch.cuda.synchronize()
                    began = time.perf_counter()
                    pre.record()
                    torch.cuda._sleep(preroll_cycles)
                    start.record()
                    out = fn(inputs)
                    end.record()
                    torch.cuda.synchronize()  # device-wide: side streams and threads finish
                    wall_ms = (time.perf_counter() - began) * 1e3 - pre.elapsed_time(start)
                    event_ms = start.elapsed_time(end)
                    sample = counted_time(event_ms, wall_ms, self._overhead_ms)
                    self.hidden_work_trials += sample > event_ms
                    samples.append(sample)
                else:
                    began = time.perf_counter()
                    out = fn(inputs)
                    samples.append((time.perf_counter() - began) * 1e3)
                del out
        if len(samples) > 1:
            samples = samples[1:]
        return summarize(samples)

    def _preroll_cycles(self, enqueue_ms: float) -> int:
        """GPU cycles of busy-wait that outlast the host enqueueing one call: three times its
        measured enqueue time plus 20 us, at least 50 us, at most 2 ms (a call that waits on the
        GPU itself, e.g. `.item()`, would otherwise ask for a pre-roll as long as its own run).
        The clock rate is measured here, after the warm-up, with the GPU at its working clock."""
        import torch

        target_ms = min(2.0, max(0.05, 3.0 * enqueue_ms + 0.02))
        probe_cycles = 200_000
        rates = []
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(probe_cycles)
            end.record()
            end.synchronize()
            rates.append(probe_cycles / max(start.elapsed_time(end), 1e-6))
        return int(target_ms * max(rates))

    def _sync(self) -> None:
        if self.cuda:
            import torch
            torch.cuda.synchronize()
