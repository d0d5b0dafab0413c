"""What `specgen optimize` leaves in its output directory.

- `events.jsonl`: every event as it happened, one JSON object a line (written live, so a run that
  dies still leaves its story);
- `result.json`: the `OptimizeResult` (best kernel, verdicts, full history, metrics);
- `best_kernel.py`: the best correct kernel's source (only when there is one);
- `timeline.json`: the run as a Chrome/Perfetto trace (see `timeline.py`);
- `journal/`: what `--resume` continues from, written as the run goes (a killed run loses
  nothing it had learnt): `run.json` (the command's settings and the job's spec), `loop.jsonl`
  (every candidate with its source when found, every verdict as it arrives, each completed
  iteration with its streams, forks and counters) and `scheduler/` (the local scheduler's
  journal: accepted candidates and their stage verdicts).

One directory holds one run: `check_out_dir` refuses a directory that is not empty unless
forced, and `clear_run_files` then removes only the files listed above and the journal. What is
created here is private (folders 0700, files 0600; runtime/private_files.py): a run holds the
problem and every candidate's source.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import IO

import msgspec

from specgen.errors import UsageError
from specgen.messages import (
    CandidateRecord, CandidateUpdate, ForkRecord, IterationRecord, OptimizeEvent, OptimizeResult,
    OptimizeSpec, ReasoningRecord,
)
from specgen.optimize.timeline import build_timeline
from specgen.runtime.private_files import make_private_dir, open_private, write_private

_encoder = msgspec.json.Encoder()
RUN_FILES = ("events.jsonl", "result.json", "best_kernel.py", "timeline.json")


def check_out_dir(out_dir: Path, force: bool, flag: str = "--force") -> None:
    """Refuse (UsageError naming `flag`) an `out_dir` that is not empty, unless `force`."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"output folder {out_dir} is a file, not a folder")
    if not force and out_dir.is_dir() and any(out_dir.iterdir()):
        raise UsageError(f"output folder {out_dir} is not empty (an earlier run?); pass {flag} to "
                         "replace its run files, or name another folder")


def clear_run_files(out_dir: Path) -> None:
    """Remove an earlier run's files from `out_dir` (other files stay)."""
    for name in RUN_FILES:
        (Path(out_dir) / name).unlink(missing_ok=True)
    shutil.rmtree(Path(out_dir) / JOURNAL_DIR, ignore_errors=True)


class RunWriter:
    """An `emit` callback that appends events to `events.jsonl`; `finish` writes the rest."""

    def __init__(self, out_dir: Path, append: bool = False) -> None:
        self.out_dir = make_private_dir(out_dir)
        self.events_path = self.out_dir / "events.jsonl"
        # A resumed run goes on with the story its first part wrote.
        self._events: IO[bytes] | None = open_private(self.events_path, "ab" if append else "wb")

    def __call__(self, event: OptimizeEvent) -> None:
        if self._events is None:
            return
        self._events.write(_encoder.encode(event) + b"\n")
        self._events.flush()

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None

    def finish(self, result: OptimizeResult) -> dict[str, Path]:
        """Write result, best kernel and timeline; the paths written, by name."""
        self.close()
        written = {"events": self.events_path}
        result_path = self.out_dir / "result.json"
        write_private(result_path, msgspec.json.format(msgspec.json.encode(result), indent=2) + b"\n")
        written["result"] = result_path
        if result.best_source is not None:
            kernel_path = self.out_dir / "best_kernel.py"
            write_private(kernel_path, result.best_source)
            written["best_kernel"] = kernel_path
        timeline_path = self.out_dir / "timeline.json"
        write_private(timeline_path, json.dumps(build_timeline(result)) + "\n")
        written["timeline"] = timeline_path
        return written


# ---------------------------------------------------------------------------------- journal

JOURNAL_DIR = "journal"
RUN_SETTINGS = "run.json"
LOOP_JOURNAL = "loop.jsonl"
SCHEDULER_STATE = "scheduler"


def write_run_settings(out_dir: Path, options: dict, spec: OptimizeSpec) -> Path:
    """The command's settings and the job's spec, for `--resume` (written before the run starts)."""
    journal = make_private_dir(Path(out_dir) / JOURNAL_DIR)
    path = journal / RUN_SETTINGS
    tmp = path.with_suffix(".tmp")
    write_private(tmp, msgspec.json.format(msgspec.json.encode(
        {"format": 1, "options": options, "spec": spec}), indent=2) + b"\n")
    tmp.replace(path)
    return path


def read_run_settings(out_dir: Path) -> tuple[dict, OptimizeSpec]:
    """(options, spec) of the run in `out_dir`; UsageError naming the file when it is no run."""
    path = Path(out_dir) / JOURNAL_DIR / RUN_SETTINGS
    if not path.is_file():
        raise UsageError(f"{out_dir} is not a specgen optimize run to resume: {path} is missing")
    try:
        raw = msgspec.json.decode(path.read_bytes())
        return dict(raw["options"]), msgspec.convert(raw["spec"], OptimizeSpec)
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError, TypeError) as exc:
        raise UsageError(f"{path} cannot be read as a run's settings: {exc}") from None


class LoopJournal:
    """Appends what the optimize loop learns to `journal/loop.jsonl`, one JSON object a line,
    flushed at once: the operating system keeps what was written when the process is killed,
    and a torn last line (a kill mid-write) is skipped when read back."""

    def __init__(self, out_dir: Path) -> None:
        journal = make_private_dir(Path(out_dir) / JOURNAL_DIR)
        self.path = journal / LOOP_JOURNAL
        self._file: IO[bytes] | None = open_private(self.path, "ab")

    def _write(self, entry: dict) -> None:
        if self._file is None:
            return
        self._file.write(_encoder.encode(entry) + b"\n")
        self._file.flush()

    def candidate(self, record: CandidateRecord) -> None:
        self._write({"kind": "candidate", "record": record})

    def update(self, update: CandidateUpdate) -> None:
        self._write({"kind": "update", "update": update})

    def iteration(self, record: IterationRecord, reasoning: list[ReasoningRecord],
                  forks: list[ForkRecord], counters: dict) -> None:
        self._write({"kind": "iteration", "record": record, "reasoning": reasoning,
                     "forks": forks, "counters": counters})

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class ResumedRun:
    """What a journal says a run had done: the loop starts again from here (see OptimizeJob)."""

    def __init__(self) -> None:
        self.candidates: dict[str, CandidateRecord] = {}     # in the order they were found
        self.updates: list[CandidateUpdate] = []              # in the order they arrived
        self.iterations: list[IterationRecord] = []           # completed ones
        self.reasoning: list[ReasoningRecord] = []
        self.forks: list[ForkRecord] = []
        self.counters: dict = {}

    @classmethod
    def read(cls, out_dir: Path) -> "ResumedRun":
        run = cls()
        path = Path(out_dir) / JOURNAL_DIR / LOOP_JOURNAL
        if not path.is_file():
            return run
        for line in path.read_bytes().splitlines():
            try:
                entry = msgspec.json.decode(line)
                kind = entry["kind"]
                if kind == "candidate":
                    record = msgspec.convert(entry["record"], CandidateRecord)
                    run.candidates[record.candidate_id] = record
                elif kind == "update":
                    run.updates.append(msgspec.convert(entry["update"], CandidateUpdate))
                elif kind == "iteration":
                    run.iterations.append(msgspec.convert(entry["record"], IterationRecord))
                    run.reasoning.extend(msgspec.convert(entry["reasoning"], list[ReasoningRecord]))
                    run.forks.extend(msgspec.convert(entry["forks"], list[ForkRecord]))
                    run.counters = dict(entry["counters"])
            except (msgspec.DecodeError, msgspec.ValidationError, KeyError, TypeError):
                continue   # the line a kill cut short
        return run
