"""A suite: many problems, each run in several modes, several times, as one resumable run.

What `specgen optimize` does with several problems (cli/suite.py runs it; cli/suite_report.py
presents it). This module holds what does not need a cluster:

- discovery: files, folders and globs to KernelBench-format problems, each checked statically
  (`eval.loader.load_problem`: parsed, never imported, so a folder of untrusted files is safe to
  scan). A file named on its own that is no problem is an error naming it; one found in a folder
  or by a glob is skipped with a warning, since checkouts hold helpers (`__init__.py`, utils);
- the plan (`suite.json` in the results folder): the problems with their sources' hashes, the
  modes, the repeats and the settings every job runs with. `--resume` compares the command's plan
  with the saved one and refuses any difference, so a finished job is never mixed with others run
  under other settings;
- the journal (`journal.jsonl`): one JSON line per finished job, written whole with one write,
  flushed and synced before the next job's line, so a suite killed at any moment leaves every
  finished job's line intact and at most one torn last line, which is read as unfinished;
- a finished job's row: the figures the report needs, from its `OptimizeResult`.
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specgen.errors import UsageError
from specgen.messages import OptimizeResult

PLAN_FILE = "suite.json"
JOURNAL_FILE = "journal.jsonl"
PLAN_FORMAT = 1
GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class SuiteProblem:
    name: str
    path: Path
    sha256: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "path": str(self.path), "sha256": self.sha256}


@dataclass
class Discovered:
    problems: list[SuiteProblem] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)    # why each file (named) is skipped


def is_suite_request(paths: list[str]) -> bool:
    """More than one problem, a folder or a glob: what makes `specgen optimize` a suite."""
    return len(paths) > 1 or any(Path(p).is_dir() or GLOB_CHARS & set(p) for p in paths)


def _check(path: Path) -> tuple[SuiteProblem | None, str]:
    from specgen.eval.loader import load_problem

    try:
        problem = load_problem(path)
    except UsageError as exc:
        return None, str(exc)
    return SuiteProblem(path.stem, path.resolve(), problem.sha256), ""


def discover(paths: list[str]) -> Discovered:
    """The problems `paths` name, in a stable order (each folder's and glob's files sorted)."""
    found = Discovered()
    seen: dict[str, Path] = {}

    def add(path: Path, named: bool) -> None:
        problem, why = _check(path)
        if problem is None:
            if named:
                raise UsageError(f"{path} is not a KernelBench problem: {why}")
            found.skipped.append(why)
            return
        if problem.name in seen:
            if seen[problem.name] == problem.path:
                return
            raise UsageError(f"two problems named {problem.name!r}: {seen[problem.name]} and "
                             f"{problem.path} (a suite names each problem by its file's stem)")
        seen[problem.name] = problem.path
        found.problems.append(problem)

    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files = sorted(p for p in path.glob("*.py") if p.is_file())
            if not files:
                raise UsageError(f"folder {path} holds no .py file")
            for file in files:
                add(file, named=False)
        elif GLOB_CHARS & set(raw) and not path.exists():
            files = sorted(Path(p) for p in glob.glob(raw) if Path(p).is_file())
            if not files:
                raise UsageError(f"{raw} matches no file")
            for file in files:
                add(file, named=False)
        elif path.is_file():
            add(path, named=True)
        else:
            raise UsageError(f"problem file {raw} not found")
    if not found.problems:
        raise UsageError("no KernelBench problem found in " + ", ".join(paths)
                         + (f" ({len(found.skipped)} file(s) skipped: {found.skipped[0]})"
                            if found.skipped else ""))
    return found


# ---------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class JobKey:
    problem: str
    mode: str
    repeat: int

    @property
    def text(self) -> str:
        return f"{self.problem}/{self.mode}/r{self.repeat}"

    def folder(self, out: Path) -> Path:
        return out / "jobs" / self.problem / f"{self.mode}-r{self.repeat}"


@dataclass
class SuitePlan:
    problems: list[SuiteProblem]
    modes: list[str]
    repeats: int
    settings: dict[str, Any]         # what every job runs with; compared on --resume
    options: dict[str, Any] = field(default_factory=dict)   # the whole command line, to resume it

    def keys(self) -> list[JobKey]:
        """Every job, repeat-major and the modes interleaved per problem, so that a suite cut
        short has every mode of the problems it reached, side by side."""
        return [JobKey(p.name, mode, r) for r in range(self.repeats) for p in self.problems
                for mode in self.modes]

    def to_json(self) -> dict[str, Any]:
        return {"format": PLAN_FORMAT, "problems": [p.to_json() for p in self.problems],
                "modes": self.modes, "repeats": self.repeats, "settings": self.settings,
                "options": self.options}

    @classmethod
    def from_json(cls, data: dict[str, Any], where: Path) -> "SuitePlan":
        try:
            if data.get("format") != PLAN_FORMAT:
                raise ValueError(f"format {data.get('format')!r}, not {PLAN_FORMAT}")
            problems = [SuiteProblem(p["name"], Path(p["path"]), p["sha256"]) for p in data["problems"]]
            return cls(problems, list(data["modes"]), int(data["repeats"]), dict(data["settings"]),
                       dict(data.get("options") or {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{where} cannot be read as a suite's plan: {exc}") from None

    def save(self, out: Path) -> Path:
        from specgen.runtime.private_files import make_private_dir, write_private

        make_private_dir(out)
        path = out / PLAN_FILE
        tmp = path.with_suffix(".tmp")
        write_private(tmp, json.dumps(self.to_json(), indent=2, default=str) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, out: Path) -> "SuitePlan":
        path = out / PLAN_FILE
        try:
            return cls.from_json(json.loads(path.read_text()), path)
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"{path} cannot be read as a suite's plan: {exc}") from None

    def differences(self, saved: "SuitePlan") -> list[str]:
        """What this plan changes against `saved`, one phrase each (empty: the same suite)."""
        out: list[str] = []
        mine = {p.name: p for p in self.problems}
        theirs = {p.name: p for p in saved.problems}
        if list(mine) != list(theirs):
            added, gone = sorted(set(mine) - set(theirs)), sorted(set(theirs) - set(mine))
            out.append("problems " + "; ".join(
                part for part in (f"added {', '.join(added)}" if added else "",
                                  f"missing {', '.join(gone)}" if gone else "",
                                  "in another order" if not added and not gone else "") if part))
        changed = sorted(n for n in set(mine) & set(theirs) if mine[n].sha256 != theirs[n].sha256)
        if changed:
            out.append(f"the source of {', '.join(changed)} changed")
        if self.modes != saved.modes:
            out.append(f"modes {','.join(self.modes)} (saved: {','.join(saved.modes)})")
        if self.repeats != saved.repeats:
            out.append(f"repeats {self.repeats} (saved: {saved.repeats})")
        for name in sorted(set(self.settings) | set(saved.settings)):
            new, old = self.settings.get(name), saved.settings.get(name)
            if new != old:
                out.append(f"{name} {new!r} (saved: {old!r})")
        return out


# ---------------------------------------------------------------------------------- journal


class SuiteJournal:
    """`journal.jsonl`: a finished job per line, each line complete on disk before the next job
    is taken as finished."""

    def __init__(self, out: Path) -> None:
        from specgen.runtime.private_files import open_private

        self.path = out / JOURNAL_FILE
        self._file = open_private(self.path, "ab")

    def add(self, row: dict[str, Any]) -> None:
        # One write of the whole line, then flush and fsync: a kill -9 leaves it whole or torn
        # at its end, and `read` drops a torn line (that job runs again).
        self._file.write((json.dumps(row, default=str) + "\n").encode())
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    @staticmethod
    def read(out: Path) -> dict[str, dict[str, Any]]:
        """Finished jobs by key text; a torn or foreign line is skipped (its job is redone)."""
        path = out / JOURNAL_FILE
        rows: dict[str, dict[str, Any]] = {}
        if not path.is_file():
            return rows
        for line in path.read_bytes().splitlines():
            try:
                row = json.loads(line)
                key = JobKey(row["problem"], row["mode"], int(row["repeat"]))
            except (ValueError, KeyError, TypeError):
                continue
            rows[key.text] = row
        return rows


# ---------------------------------------------------------------------------------- rows


def job_row(key: JobKey, result: OptimizeResult, folder: Path, out: Path,
            trace: Path | None = None) -> dict[str, Any]:
    """A finished job as the journal keeps it and the report reads it."""
    metrics = result.metrics
    verdict = result.best_verdict
    correct = result.best_speedup is not None and result.best_source is not None
    return {
        "problem": key.problem, "mode": key.mode, "repeat": key.repeat,
        "job_id": result.job_id, "status": result.status, "stop_reason": result.stop_reason,
        "correct": correct,
        "speedup": result.best_speedup if correct else None,
        "cpu_timing": result.cpu_timing,
        "device": getattr(verdict, "device", None) if verdict is not None else None,
        "end_to_end_s": metrics.end_to_end_s,
        "time_to_best_s": metrics.time_to_best_s,
        "tokens": metrics.total_tokens,
        "reasoning_tokens": metrics.reasoning_tokens,
        "fork_tokens": metrics.fork_tokens,
        "iterations": metrics.iterations,
        "feedback": metrics.profiled,          # profiling verdicts received
        "validated": metrics.validated,
        "candidates": metrics.candidates,
        "forks": metrics.forks,
        "error": result.error,
        "folder": str(folder.relative_to(out)),
        "best_kernel": (str((folder / "best_kernel.py").relative_to(out)) if correct else None),
        "trace": str(trace.relative_to(out)) if trace is not None else None,
    }
