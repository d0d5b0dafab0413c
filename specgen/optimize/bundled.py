"""The example problems and hand-written traces that ship with specgen.

Problems live in `specgen/data/problems/NAME.py`; a trace for problem NAME in
`specgen/data/traces/NAME.trace.json` (made by `tools/make_traces.py` from the readable sources in
`specgen/data/traces/sources/`). `specgen optimize` with no problem and no engine runs
`DEFAULT_PROBLEM` from its trace.
"""
from __future__ import annotations

from pathlib import Path

from specgen.errors import UsageError

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
PROBLEMS_DIR = DATA_DIR / "problems"
TRACES_DIR = DATA_DIR / "traces"
TRACE_SUFFIX = ".trace.json"
DEFAULT_PROBLEM = "fused_elementwise"


def bundled_problems() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PROBLEMS_DIR.glob("*.py")) if not p.name.startswith("_")}


def bundled_traces() -> dict[str, Path]:
    return {p.name[: -len(TRACE_SUFFIX)]: p for p in sorted(TRACES_DIR.glob(f"*{TRACE_SUFFIX}"))}


def bundled_problem(name: str) -> Path:
    problems = bundled_problems()
    if name not in problems:
        raise UsageError(f"no bundled problem named {name!r}; bundled: {', '.join(problems)}")
    return problems[name]


def bundled_trace(problem_name: str) -> Path | None:
    """The bundled trace for a problem of that name, or None."""
    return bundled_traces().get(problem_name)
