"""Timing a model the way the verdict reports it.

On a GPU, for each timed call: the L2 cache is flushed (a buffer larger than L2 is overwritten),
the device is synchronized, a start event is recorded, the model runs on the next of several
input sets (rotated, so a result cached from the previous call is never the right one), the
whole device is synchronized (so work the candidate put on side streams or other threads is
counted), and an end event is recorded. The fixed cost of that synchronize/record sequence is
measured with no work between and subtracted. The first timed call is dropped; the median and
the spread (p75 - p25) / median are reported.

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


class Timer:
    """Times callables on one device; owns the L2-flush buffer and the sync-overhead estimate."""

    def __init__(self, device: str, l2_flush_mb: int) -> None:
        import torch

        self.device = device
        self.cuda = device.startswith("cuda")
        flush_mb = l2_flush_mb if self.cuda else min(l2_flush_mb, 64)
        self._flush = torch.empty(flush_mb * 1024 * 1024, dtype=torch.uint8, device=device)
        self._overhead_ms = self._measure_overhead() if self.cuda else 0.0

    def flush(self) -> None:
        self._flush.add_(1)  # a read-modify-write of the whole buffer evicts other lines

    def _measure_overhead(self) -> float:
        import torch

        samples = []
        for _ in range(25):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            torch.cuda.synchronize()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        return statistics.median(samples[5:])

    def time(self, fn: Callable[[Any], Any], input_sets: Sequence[Any], warmup: int,
             trials: int) -> TimingStats:
        """Time `fn(inputs)` over `trials` calls (first dropped), rotating `input_sets`."""
        import torch

        count = len(input_sets)
        with torch.no_grad():
            for index in range(warmup):
                fn(input_sets[index % count])
            self._sync()
            samples: list[float] = []
            for index in range(trials):
                inputs = input_sets[index % count]
                self.flush()
                if self.cuda:
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    torch.cuda.synchronize()
                    start.record()
                    out = fn(inputs)
                    torch.cuda.synchronize()  # device-wide: side streams and threads count
                    end.record()
                    end.synchronize()
                    samples.append(max(start.elapsed_time(end) - self._overhead_ms, 1e-4))
                else:
                    began = time.perf_counter()
                    out = fn(inputs)
                    samples.append((time.perf_counter() - began) * 1e3)
                del out
        if len(samples) > 1:
            samples = samples[1:]
        return summarize(samples)

    def _sync(self) -> None:
        if self.cuda:
            import torch
            torch.cuda.synchronize()
