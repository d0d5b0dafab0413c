"""What `specgen optimize` leaves in its output directory.

- `events.jsonl`: every event as it happened, one JSON object a line (written live, so a run that
  dies still leaves its story);
- `result.json`: the `OptimizeResult` (best kernel, verdicts, full history, metrics);
- `best_kernel.py`: the best correct kernel's source (only when there is one);
- `timeline.json`: the run as a Chrome/Perfetto trace (see `timeline.py`).

One directory holds one run: `check_out_dir` refuses a directory that is not empty unless
forced, and `clear_run_files` then removes only the files listed above.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import IO

import msgspec

from specgen.errors import UsageError
from specgen.messages import OptimizeEvent, OptimizeResult
from specgen.optimize.timeline import build_timeline

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


class RunWriter:
    """An `emit` callback that appends events to `events.jsonl`; `finish` writes the rest."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.events_path = self.out_dir / "events.jsonl"
        self._events: IO[bytes] | None = self.events_path.open("wb")

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
        result_path.write_bytes(msgspec.json.format(msgspec.json.encode(result), indent=2) + b"\n")
        written["result"] = result_path
        if result.best_source is not None:
            kernel_path = self.out_dir / "best_kernel.py"
            kernel_path.write_text(result.best_source)
            written["best_kernel"] = kernel_path
        timeline_path = self.out_dir / "timeline.json"
        timeline_path.write_text(json.dumps(build_timeline(result)) + "\n")
        written["timeline"] = timeline_path
        return written
