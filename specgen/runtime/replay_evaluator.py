"""An evaluator that plays back recorded service times and outcomes instead of evaluating.

For pool benchmarks and load tests only (worker setting `--evaluator replay[:RECORDING]`): it
lets a 2-core machine stand in for a rack of GPUs whose validation and profiling times were
recorded elsewhere. Never the default, and every verdict it returns says it was replayed
(`stage_seconds["replayed"]`, and `flags` carries "replayed").

What to play back for a candidate comes from, in order: a first line of the candidate source
`# specgen-replay: {"validate_s": .., "correct": .., "profile_s": .., "speedup": ..}` (synthetic
workloads set it per candidate), else a sample of the recording picked by a hash of the
candidate id (so a re-queued candidate replays the same way on any worker).
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path

import msgspec

from specgen.errors import UsageError
from specgen.messages import CandidateSubmission, Verdict

DIRECTIVE = "# specgen-replay:"


class ReplaySample(msgspec.Struct, kw_only=True):
    validate_s: float                       # service time of validation
    correct: bool = True                    # validation outcome
    profile_s: float = 0.0                  # service time of profiling
    speedup: float | None = None            # profiling outcome


_directive_decoder = msgspec.json.Decoder(ReplaySample)


class Recording(msgspec.Struct, kw_only=True):
    source: str                             # how and where the samples were recorded
    samples: list[ReplaySample]


def directive(sample: ReplaySample) -> str:
    return f"{DIRECTIVE} {msgspec.json.encode(sample).decode()}\n"


class ReplayEvaluator:
    def __init__(self, recording: Recording | None = None, speed: float = 1.0) -> None:
        self.recording = recording
        self.speed = speed
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._run_id: str | None = None
        self._early_cancels: set[str] = set()

    @classmethod
    def from_spec(cls, spec: str) -> "ReplayEvaluator":
        """`replay` (directives only) or `replay:PATH` (a Recording as JSON)."""
        _, _, path = spec.partition(":")
        if not path:
            return cls()
        try:
            recording = msgspec.json.decode(Path(path).read_bytes(), type=Recording)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise UsageError(f"cannot read replay recording {path}: {exc}") from None
        if not recording.samples:
            raise UsageError(f"replay recording {path} has no samples")
        return cls(recording)

    def start(self) -> None:
        pass

    def close(self) -> None:
        self.cancel()

    def cancel(self, run_id: str | None = None) -> None:
        with self._lock:
            if run_id is not None and run_id != self._run_id:
                self._early_cancels.add(run_id)   # the run has not started: applied when it does
                return
            self._cancel.set()

    def plan(self, sub: CandidateSubmission) -> ReplaySample:
        first = sub.candidate_source.split("\n", 1)[0]
        if first.startswith(DIRECTIVE):
            try:
                return _directive_decoder.decode(first[len(DIRECTIVE):].strip())
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise ValueError(f"bad replay directive: {exc}") from None
            except RecursionError:
                raise ValueError("bad replay directive: nested too deeply") from None
        if self.recording is None:
            raise ValueError("candidate has no replay directive and the worker has no recording")
        digest = hashlib.blake2b(f"{sub.job_id}/{sub.candidate_id}".encode(), digest_size=8).digest()
        return self.recording.samples[int.from_bytes(digest, "little") % len(self.recording.samples)]

    def run(self, submission: CandidateSubmission, stage: str = "full",
            run_id: str | None = None) -> Verdict:
        with self._lock:
            self._run_id = run_id
            if run_id is not None and run_id in self._early_cancels:
                self._early_cancels.discard(run_id)
                self._cancel.set()
            else:
                self._cancel.clear()
        try:
            plan = self.plan(submission)
        except ValueError as exc:
            return Verdict(stage=stage, error=str(exc), flags=["replayed"])
        seconds = {"validate": plan.validate_s, "profile": plan.profile_s,
                   "full": plan.validate_s + (plan.profile_s if plan.correct else 0.0)}[stage]
        start = time.monotonic()
        if self._cancel.wait(seconds / self.speed) if seconds > 0 else self._cancel.is_set():
            return Verdict(stage=stage, error="cancelled while replaying", code="cancelled",
                           flags=["replayed"])
        elapsed = time.monotonic() - start
        profiled = stage != "validate" and plan.correct
        speedup = plan.speedup if profiled else None
        return Verdict(
            stage=stage, compiled=True, correct=plan.correct, speedup=speedup,
            ref_ms=1.0 if profiled else None,
            candidate_ms=(1.0 / speedup) if speedup else None,
            flags=["replayed"], stage_seconds={"replayed": elapsed},
            error=None if plan.correct else "replayed: incorrect output",
        )


def write_recording(path: Path, recording: Recording) -> None:
    path.write_text(json.dumps(msgspec.to_builtins(recording), indent=1) + "\n")
