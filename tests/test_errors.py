"""One exception hierarchy: every error specgen raises on purpose is a SpecgenError, so the CLI
prints it as one line instead of a traceback (`specgen/errors.py` names the exceptions)."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import specgen
from specgen.cli import main
from specgen.errors import SpecgenError

# Private control-flow signals, a BaseException that no `except Exception` may swallow, a warning,
# and the compiled modules' own types (pybind11 registers them on RuntimeError).
OUTSIDE = {"specgen.eval.profiling._ReferenceFailed", "specgen.eval.findings.Stop",
           "specgen.traces.importing.staging.ImportInterrupted",
           "specgen.traces.importing.importer.TraceImportWarning",
           "specgen.kv._kv_transfer.KvTransferError", "specgen.eval._digest.DigestError",
           "specgen.eval._arena.ArenaError",
           # the build runner's own signals while it calls ModelNew on meta tensors: caught there
           "specgen.eval.extensions.ProbeStop", "specgen.eval.discovery._ProbeTimeout"}


def _exception_classes() -> dict[str, type]:
    found = {}
    for info in pkgutil.walk_packages(specgen.__path__, "specgen."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:     # an optional part this machine lacks (vLLM, the CUDA build)
            continue
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) \
                    and value.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_error_specgen_raises_on_purpose_is_a_specgen_error() -> None:
    classes = _exception_classes()
    assert "specgen.eval.runner_process.RunnerError" in classes
    outside = {name for name, cls in classes.items() if not issubclass(cls, SpecgenError)}
    assert outside <= OUTSIDE, sorted(outside - OUTSIDE)


def test_the_cli_prints_one_line_for_a_specgen_error(monkeypatch, capsys) -> None:
    from specgen.eval.runner_process import RunnerError
    from specgen.cli import optimize as commands

    def fail(args):
        raise RunnerError("the runner's template exited at start-up")

    monkeypatch.setattr(commands, "run_optimize", fail)
    assert main(["optimize"]) == 1
    err = capsys.readouterr().err
    assert err == "specgen optimize: error: the runner's template exited at start-up\n"
    assert isinstance(RunnerError("x"), RuntimeError)       # callers' `except RuntimeError` holds
