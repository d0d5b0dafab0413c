"""Finding every `load_inline` call of a candidate in its build runner, so that no run compiles.

A candidate calls `load_inline` when its module runs, in `ModelNew.__init__` (most public
KernelBench candidates), or in its first `forward` (a lazy build). Once the module has run (which
makes the first kind), the build runner makes the other two happen without running a kernel:

1. `ModelNew(*get_init_inputs())` under `torch.device("meta")`, at the run's scale: parameters
   take no memory whatever their size, and a call made from the constructor's arguments gets
   the run's ones;
2. `forward` on `get_inputs()` made as meta tensors, still under the meta device, at the run's
   shape and at the second shape the judge's probe asks for (probes.py): a source or a name made
   from the sizes is the run's, and nothing is computed; an extension's functions raise
   `ProbeStop` instead of running (extensions.BuildSession);
3. every `load_inline(...)` written in the source whose arguments can be computed from the
   module's globals is made with them, several at once: a call in a branch the meta call did not
   reach, or after the point where it failed (a `.cuda()`, a check of the device), is built all
   the same. A call made already with the same arguments is not built again.

Whatever the candidate's code raises ends that step only. What is still missed are calls whose
arguments exist only at run time (the GPU's name, a random or time-stamped name, values of the
inputs): a run refuses those (extensions.NOT_BUILT_AHEAD).
"""
from __future__ import annotations

import ast
import contextlib
import signal
import threading
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

from specgen.eval.extensions import BuildSession
from specgen.eval.loader import CandidateSource, called_name
from specgen.messages import LoadProblem

# A step of a meta probe is Python running over shapes: seconds at most. One that is still
# running after this is stuck in the candidate's own loop, and the build goes on without it.
PROBE_SECONDS = 60
# Calls of the source's sweep built at once: each is a compiler or two of about 1.5 GB.
SWEEP_THREADS = 4
_LOADER = "__specgen_load_inline__"


class _ProbeTimeout(BaseException):
    """The probe ran past PROBE_SECONDS (a BaseException, so the candidate's `except
    Exception` does not swallow it)."""


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Interrupt Python code that runs past `seconds` (the main thread only: where signals go)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise _ProbeTimeout(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def discover(session: BuildSession, candidate: CandidateSource, module: types.ModuleType,
             problem: LoadProblem | None, directory: Path) -> list[str]:
    """Make the candidate's constructor, forward and written-out calls happen (the module has
    run). Returns what each step that stopped early raised, for the build's log."""
    stopped: list[str] = []
    session.probing = True
    try:
        if problem is not None:
            stopped += _probe_model(module, problem, directory)
        stopped += sweep(session, candidate, module)
    finally:
        session.probing = False
    return stopped


def _probe_model(module: types.ModuleType, problem: LoadProblem, directory: Path) -> list[str]:
    import torch

    from specgen.eval.calls import ProblemModule
    from specgen.eval.inputs import other_size

    model_new = getattr(module, "ModelNew", None)
    if model_new is None:
        return []
    try:
        with _deadline(PROBE_SECONDS), torch.device("meta"):
            reference = ProblemModule(problem, "meta", directory)
            torch.manual_seed(problem.init_seed)
            model = model_new(*reference.init_inputs)
    except BaseException as exc:  # noqa: BLE001 - the candidate's (or problem's) code may raise anything
        return [f"ModelNew(*get_init_inputs()): {_describe(exc)}"]
    stopped = []
    # The run's shape, then the second shape the judge's probe will ask for (probes.py): a source
    # specialized to the input's sizes is built for both.
    try:
        constants = reference.shape_constants()
    except Exception:  # noqa: BLE001
        constants = {}
    shapes = [{}] + ([{name: other_size(value) for name, value in constants.items()}]
                     if constants else [])
    for shape in shapes:
        try:
            with _deadline(PROBE_SECONDS), torch.device("meta"), torch.no_grad():
                model(*_meta_inputs(reference, shape))
        except BaseException as exc:  # noqa: BLE001
            stopped.append(f"forward{' at ' + str(shape) if shape else ''}: {_describe(exc)}")
    return stopped


def _meta_inputs(reference: Any, shape: dict[str, int]) -> list[Any]:
    """get_inputs() as meta tensors, with the module constants `shape` in force."""
    saved = {name: getattr(reference.module, name) for name in shape}
    try:
        for name, value in shape.items():
            setattr(reference.module, name, value)
        return list(reference.module.get_inputs())
    finally:
        for name, value in saved.items():
            setattr(reference.module, name, value)


def sweep(session: BuildSession, candidate: CandidateSource, module: types.ModuleType
          ) -> list[str]:
    """Make each `load_inline(...)` call of the source whose arguments evaluate in the module's
    globals (see the module doc), SWEEP_THREADS at a time."""
    calls = [node for node in ast.walk(candidate.tree)
             if isinstance(node, ast.Call) and called_name(node.func) == "load_inline"]
    if not calls:
        return []
    namespace = dict(vars(module))
    namespace[_LOADER] = session.load_inline

    def make(node: ast.Call) -> str | None:
        call = ast.Call(func=ast.Name(id=_LOADER, ctx=ast.Load()), args=node.args,
                        keywords=node.keywords)
        expression = ast.fix_missing_locations(ast.copy_location(ast.Expression(body=call), node))
        try:
            code = compile(expression, module.__file__ or "<candidate>", "eval")
            eval(code, dict(namespace))  # noqa: S307 - the candidate's own code, in its build runner
        except NameError:
            return None                    # an argument made inside a function: not knowable here
        except BaseException as exc:  # noqa: BLE001 - a failed build is recorded by the session
            return f"line {node.lineno}: {_describe(exc)}"
        return None

    with ThreadPoolExecutor(max_workers=min(SWEEP_THREADS, len(calls)),
                            thread_name_prefix="specgen-sweep") as pool:
        return [r for r in pool.map(make, calls) if r]


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
