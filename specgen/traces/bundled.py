"""The example problems and hand-written traces that ship with specgen.

Problems live in `specgen/data/problems/NAME.py`; a trace for problem NAME in
`specgen/data/traces/NAME.trace.json` (made by `tools/make_traces.py` from the readable sources in
`specgen/data/traces/sources/`). `specgen optimize` with no problem and no engine runs
`DEFAULT_PROBLEM` from its hand-written trace on a host with a GPU, and on a host without one
`DEFAULT_CPU_PROBLEM` from its generated trace in `specgen/data/traces/generated/` (made by
`tools/make_traces.py --generated`: one turn of `specgen.traces.synthetic`, seed 0).

`DEFAULT_CPU_PROBLEM` is the bundled problem whose honest C++ candidate
(`candidates/<problem>_cpp.py`) measured fastest against its reference on a 2-core CPU at the CPU
problem scale (docs/optimize.md, "First run on a CPU"): its kernels run natively, so a CPU run
judges real compiled code rather than Triton under its interpreter.
"""
from __future__ import annotations

from pathlib import Path

from specgen.errors import UsageError

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
PROBLEMS_DIR = DATA_DIR / "problems"
TRACES_DIR = DATA_DIR / "traces"
TRACE_SUFFIX = ".trace.json"
GENERATED_TRACES_DIR = TRACES_DIR / "generated"
DEFAULT_PROBLEM = "fused_elementwise"
DEFAULT_CPU_PROBLEM = "layernorm"


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


def generated_trace_path(problem_name: str) -> Path:
    """Where the generated trace of a problem lives (whether or not it exists)."""
    return GENERATED_TRACES_DIR / f"{problem_name}{TRACE_SUFFIX}"


def default_run(gpu: bool) -> tuple[str, Path]:
    """(problem name, trace) that `specgen optimize` with no problem and no engine replays: the
    hand-written trace of DEFAULT_PROBLEM on a host with a GPU, the generated trace of
    DEFAULT_CPU_PROBLEM on one without."""
    if gpu:
        trace = bundled_trace(DEFAULT_PROBLEM)
        assert trace is not None, f"the bundled trace of {DEFAULT_PROBLEM} is missing"
        return DEFAULT_PROBLEM, trace
    return DEFAULT_CPU_PROBLEM, generated_trace_path(DEFAULT_CPU_PROBLEM)
