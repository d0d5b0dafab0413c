"""The verdict as the judge writes it (eval/judge.py): what failed, the guards' flags, the notes on
checks skipped, the wall time of each stage, the largest errors the comparisons found.

Every part of the judge writes here; `finish` makes the verdict of what was found. Only the first
error is kept, and the first flag of each code.
"""
from __future__ import annotations

import time

from specgen.messages import Verdict


class Stop(Exception):
    """The evaluation cannot go on (the verdict already says why)."""


class Findings:
    """What one evaluation found so far (see the module doc)."""

    def __init__(self, device: str, cuda: bool) -> None:
        self.verdict = Verdict(device=device, cpu_timing=not cuda)
        self.flags: dict[str, str] = {}
        self.notes: list[str] = []
        self.seconds: dict[str, float] = {}
        self.compared = False
        self.max_abs = self.max_rel = 0.0

    def fail(self, error: str) -> None:
        if self.verdict.error is None:
            self.verdict.error = error[:4000]

    def flag(self, flag: str) -> None:
        self.flags.setdefault(flag.split(":", 1)[0], flag[:1000])

    def clean(self) -> bool:
        """No flag, no error: the candidate is correct as far as it was checked."""
        return not self.flags and self.verdict.error is None

    def comparison(self, max_abs: float, max_rel: float) -> None:
        """A full comparison of an output was made: its errors count towards the verdict's."""
        self.compared = True
        self.max_abs = max(self.max_abs, max_abs)
        self.max_rel = max(self.max_rel, max_rel)

    def timed(self, key: str) -> "_Clock":
        """A block whose wall time adds to stage `key`."""
        return _Clock(self.seconds, key)

    def finish(self, stage: str, began: float) -> Verdict:
        """The verdict of what was found, for an evaluation begun at `began` (time.monotonic())."""
        v = self.verdict
        v.stage = stage
        v.flags = list(self.flags.values())
        if self.compared:
            v.max_abs_error, v.max_rel_error = self.max_abs, self.max_rel
        if v.flags or v.error:
            v.correct = False
        v.notes = self.notes
        self.seconds["judge"] = time.monotonic() - began
        v.stage_seconds = {k: round(s, 4) for k, s in self.seconds.items()}
        return v


class _Clock:
    def __init__(self, seconds: dict[str, float], key: str) -> None:
        self.seconds, self.key = seconds, key

    def __enter__(self) -> None:
        self.began = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.seconds[self.key] = self.seconds.get(self.key, 0.0) + time.perf_counter() - self.began
