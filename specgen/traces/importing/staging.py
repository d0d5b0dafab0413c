"""Writing an import: every file into a staging folder inside the output directory, then moved
into place; undone on an error and on SIGINT or SIGTERM (`Interrupts`), so that nothing is ever
half-imported.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from specgen.traces.format import Trace
from specgen.traces.importing.turns import TraceImportError

TRACE_SUFFIX = ".trace.json"


@dataclass
class ImportedTrace:
    path: Path                     # the trace file written
    problem: str
    turns: int
    timing: str
    problem_source: Path | None    # the problem program written beside it, if any
    sample: str | None = None      # which of the problem's traces, when it has several
    records: list[str] = field(default_factory=list)   # its turns' record ids, else file:line


class ImportInterrupted(BaseException):
    """SIGTERM arrived during an import. Raised where the import was, so that it removes what it
    wrote; a BaseException, as KeyboardInterrupt is, so that handlers of errors let it through."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


class Interrupts:
    """While an import runs SIGTERM raises `ImportInterrupted` (SIGINT raises KeyboardInterrupt, as
    always), so that the import removes its staging folder and undoes its moves instead of dying
    with them in `--out`. While it undoes them, and once its files are in place, signals wait:
    in the first case they are raised when the undoing is done, in the second they are delivered
    again, to the handlers of before, when the import returns. Handlers can be set only in the main
    thread; elsewhere signals are left as they are."""

    def __init__(self) -> None:
        self._active = threading.current_thread() is threading.main_thread()
        self._previous: dict[int, Any] = {}
        self._holding = 0
        self._committed = False
        self._pending: int | None = None

    def __enter__(self) -> "Interrupts":
        if self._active:
            self._install(signal.SIGTERM, lambda previous: previous is not signal.SIG_IGN and previous is not None)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for signum, previous in reversed(list(self._previous.items())):
            signal.signal(signum, previous)
        self._previous.clear()
        pending, self._pending = self._pending, None
        if pending is not None and self._committed:
            signal.raise_signal(pending)

    def _install(self, signum: int, wanted: Callable[[Any], bool]) -> None:
        previous = signal.getsignal(signum)
        if signum not in self._previous and wanted(previous):
            self._previous[signum] = previous
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self._holding:
            self._pending = self._pending or signum
            return
        self._raise(signum)

    @staticmethod
    def _raise(signum: int) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise ImportInterrupted(signum)

    def _hold(self) -> None:
        self._holding += 1
        if self._active and self._holding == 1:
            # Only Python's own SIGINT handler is stood in for: a program's own, or SIG_IGN, stays.
            self._install(signal.SIGINT, lambda previous: previous is signal.default_int_handler)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Signals wait until the block is done, then are raised (a signal wins over an error)."""
        self._hold()
        try:
            yield
        finally:
            self._holding -= 1
            if not self._holding and not self._committed:
                if signal.SIGINT in self._previous:
                    signal.signal(signal.SIGINT, self._previous.pop(signal.SIGINT))
                pending, self._pending = self._pending, None
                if pending is not None:
                    self._raise(pending)

    def commit(self) -> None:
        """The files are in place: from now on a signal waits until the import returns."""
        self._hold()
        self._committed = True


def _safe_file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "__", name).strip(".") or "problem"


def write_all(out_dir: Path, traces: list[tuple[str, str | None, Trace, str | None]], force: bool,
              interrupts: Interrupts) -> list[ImportedTrace]:
    """Write into a temporary directory inside `out_dir`, then move into place; undo on error and
    on a signal (see `Interrupts`)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise TraceImportError(f"--out {out_dir}: exists and is not a directory")
    created = out_dir if not out_dir.exists() else None     # the topmost directory this call creates
    while created is not None and not created.parent.exists():
        created = created.parent
    staging: Path | None = None
    moved: list[tuple[Path, Path | None]] = []        # (target, backup of what it replaced)
    made_dirs: list[Path] = []
    try:
        with interrupts.held():                       # created and known here, or not created
            try:
                out_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise TraceImportError(f"--out {out_dir}: cannot be created ({exc.strerror or exc})") from None
            staging = Path(tempfile.mkdtemp(prefix=".trace-import-", dir=out_dir))
        plan: list[tuple[Path, Path]] = []            # (staged file, target)
        results: list[ImportedTrace] = []
        used: set[str] = set()
        source_targets: dict[str, Path] = {}
        for number, (name, sample, trace, source) in enumerate(traces):
            file_name = _safe_file_name(name) + ("" if sample is None else "." + _safe_file_name(sample))
            while file_name in used:
                file_name += "_"
            used.add(file_name)
            staged = staging / f"{number}{TRACE_SUFFIX}"
            trace.save(staged)
            target = out_dir / f"{file_name}{TRACE_SUFFIX}"
            plan.append((staged, target))
            source_target = source_targets.get(name)
            if source is not None and source_target is None:
                source_target = source_targets[name] = out_dir / f"{name}.py"
                staged_source = staging / f"{number}.py"
                staged_source.write_text(source if source.endswith("\n") else source + "\n", encoding="utf-8")
                plan.append((staged_source, source_target))
            records = [it.record.id or f"{it.record.file}:{it.record.line}"
                       for it in trace.iterations if it.record is not None]
            results.append(ImportedTrace(path=target, problem=name, turns=len(trace.iterations),
                                         timing=trace.metadata.timing, problem_source=source_target,
                                         sample=sample, records=list(dict.fromkeys(records))))
        for staged, target in plan:
            if target.exists() and not force:
                if target.suffix == ".py" and target.read_bytes() == staged.read_bytes():
                    continue
                raise TraceImportError(f"--out {out_dir}: {target.name} exists (--force replaces it)")
        for number, (staged, target) in enumerate(plan):
            if target.exists() and target.suffix == ".py" and target.read_bytes() == staged.read_bytes():
                continue
            missing = []
            parent = target.parent
            while not parent.exists():
                missing.append(parent)
                parent = parent.parent
            target.parent.mkdir(parents=True, exist_ok=True)
            made_dirs.extend(reversed(missing))
            backup = None
            if target.exists():
                backup = staging / f"replaced-{number}"
                os.replace(target, backup)
            moved.append((target, backup))
            os.replace(staged, target)
        interrupts.commit()
        return results
    except BaseException as exc:
        with interrupts.held():
            for target, backup in reversed(moved):
                try:
                    if target.exists():
                        target.unlink()
                    if backup is not None:
                        os.replace(backup, target)
                except OSError:
                    pass
            for directory in reversed(made_dirs):
                try:
                    directory.rmdir()
                except OSError:
                    pass
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
        if isinstance(exc, OSError):
            raise TraceImportError(f"--out {out_dir}: cannot write ({exc.strerror or exc})") from exc
        raise
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
