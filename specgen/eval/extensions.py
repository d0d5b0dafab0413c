"""`torch.utils.cpp_extension.load_inline` as the evaluation sees it: built apart, cached, counted.

Inside a runner, `load_inline` is replaced before the candidate's module runs:

* In a build runner (`mode="build"`) it compiles for real, in the runner's private /tmp (a
  size-capped tmpfs: the disk is never written), and the runner sends each library back whole;
  the worker, not the build runner, writes it into the cache (`publish_builds`). The build
  runner runs the candidate's module, so it is as untrusted as the candidate: it sees the cache
  read-only.
* In a candidate runner (`mode="run"`) it loads the cached library without compiling; only a
  cache miss (an argument computed at run time) builds in-process, in its own /tmp. A cached
  build failure is raised again at once instead of compiling again.

The cache is scoped by the candidate's source hash (`<cache>/ext/<sha256>/<key>/`): a library is
only ever loaded by the candidate whose own build produced it, so no candidate can plant code
that another candidate's run would load.

Either way it returns a proxy of the extension module that counts calls to its functions and
the exceptions they raise, so the judge can tell a kernel that never ran (an extension that
failed to build, with a fallback to PyTorch that did run) from one that did.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable

from specgen.errors import SpecgenError
from specgen.messages import BuildRecord, BuildResult

_KEY_IGNORED = {"build_directory", "verbose", "keep_intermediates"}


class ExtensionBuildError(SpecgenError, RuntimeError):
    """A load_inline build failed (compile or link error)."""


class KernelLedger:
    """Counts custom-kernel launches and the exceptions they raised, per call window."""

    def __init__(self) -> None:
        self.launches = 0
        self.errors: list[str] = []
        self.builds: list[BuildRecord] = []
        self.libraries: list[str] = []       # per build record: the library it compiled, or ""

    def reset_window(self) -> tuple[int, int]:
        return self.launches, len(self.errors)


class CountingModule(types.ModuleType):
    """Stands in for a compiled extension: same attributes, calls counted."""

    def __init__(self, inner: types.ModuleType, ledger: KernelLedger, counts: bool = True) -> None:
        super().__init__(inner.__name__, getattr(inner, "__doc__", None))
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_ledger", ledger)
        object.__setattr__(self, "_counts", counts)
        self.__file__ = getattr(inner, "__file__", None)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if callable(value) and not isinstance(value, type):
            return _counted(value, self._ledger, f"{self._inner.__name__}.{name}", self._counts)
        return value

    def __dir__(self) -> list[str]:
        return dir(self._inner)


def _counted(fn: Callable[..., Any], ledger: KernelLedger, label: str,
             counts: bool = True) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        ledger.launches += counts
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            ledger.errors.append(f"{label}: {type(exc).__name__}: {exc}"[:500])
            raise
    call.__name__ = getattr(fn, "__name__", label)
    call.__doc__ = getattr(fn, "__doc__", None)
    return call


def arguments_key(bound: inspect.BoundArguments) -> str:
    """Hash of what determines the built library: sources, flags, torch and target archs."""
    import torch

    parts = {k: v for k, v in sorted(bound.arguments.items()) if k not in _KEY_IGNORED}
    material = json.dumps(parts, sort_keys=True, default=repr) + "|" + str(torch.__version__) + "|" + \
        os.environ.get("TORCH_CUDA_ARCH_LIST", "") + "|" + sys.version.split()[0]
    return hashlib.sha256(material.encode()).hexdigest()[:24]


class ExtensionCache:
    """On-disk cache of one candidate's libraries: `<cache>/ext/<scope>/<key>/<name>.so`, or
    `<key>/FAILED` with the error. Read by runners; written by the worker (and by a runner only
    where it can write, i.e. outside a sandbox)."""

    def __init__(self, cache_dir: Path, scope: str) -> None:
        self.root = cache_dir / "ext" / scope

    def library(self, key: str, name: str) -> Path | None:
        path = self.root / key / f"{name}.so"
        return path if path.is_file() else None

    def failure(self, key: str) -> str | None:
        path = self.root / key / "FAILED"
        return path.read_text(errors="replace") if path.is_file() else None

    def _publish(self, key: str, fill: Callable[[Path], None]) -> None:
        # Fill a private directory, then rename it into place: readers never see half a build,
        # and two workers publishing the same key keep whichever came first.
        staging = self.root / f".{key}.{os.getpid()}.{time.monotonic_ns()}"
        try:
            staging.mkdir(parents=True)
            fill(staging)
            os.rename(staging, self.root / key)
        except OSError:
            pass  # already published by another worker, or a read-only view (a sandbox)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)

    def store_library(self, key: str, name: str, built: Path) -> None:
        self._publish(key, lambda d: shutil.copy2(built, d / f"{name}.so"))

    def store_bytes(self, key: str, name: str, data: bytes) -> None:
        self._publish(key, lambda d: (d / f"{name}.so").write_bytes(data))

    def store_failure(self, key: str, error: str) -> None:
        self._publish(key, lambda d: (d / "FAILED").write_text(error))


def publish_builds(cache_dir: Path, scope: str, result: BuildResult) -> None:
    """Write what a build runner sent back into the cache (the worker's side of a build).

    It comes from untrusted code: a key or name that is not a plain token is skipped, and a
    library is only ever loaded by runs of the candidate whose own build made it (`scope`)."""
    cache = ExtensionCache(cache_dir, scope)
    for record in result.records:
        if not (_TOKEN.fullmatch(record.key) and _TOKEN.fullmatch(record.name)):
            continue
        if not record.ok and record.error and not record.cached:
            cache.store_failure(record.key, record.error[:2000])
    for library in result.libraries:
        if _TOKEN.fullmatch(library.key) and _TOKEN.fullmatch(library.name):
            cache.store_bytes(library.key, library.name, library.data)


_TOKEN = re.compile(r"[A-Za-z0-9_]{1,128}")


def _import_library(name: str, path: Path, is_python_module: bool) -> Any:
    if not is_python_module:
        import torch
        torch.ops.load_library(str(path))
        return str(path)
    spec = importlib.util.spec_from_file_location(name, str(path))
    if spec is None or spec.loader is None:
        raise ExtensionBuildError(f"cannot load extension library {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def has_device_code(bound: inspect.BoundArguments) -> bool:
    """Whether a load_inline call's sources define GPU code of their own."""
    def text(value: Any) -> str:
        return value if isinstance(value, str) else "\n".join(value or ())
    return bool(text(bound.arguments.get("cuda_sources")).strip()) or \
        "__global__" in text(bound.arguments.get("cpp_sources"))


def install(mode: str, cache_dir: Path, build_dir: Path, ledger: KernelLedger,
            scope: str, device: str = "cpu") -> None:
    """Replace load_inline (mode "build" or "run") for the rest of this process; `scope` is the
    candidate's source hash (computed before its module runs). On a CUDA `device`, calls into an
    extension without device code of its own (C++ that only calls ATen or a library) are not
    counted as custom-kernel launches: the GPU only runs library kernels for it."""
    import torch.utils.cpp_extension as cpp_extension

    real = cpp_extension.load_inline
    signature = inspect.signature(real)
    cache = ExtensionCache(cache_dir, scope)

    def load_inline(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        name = bound.arguments["name"]
        is_python_module = bound.arguments.get("is_python_module", True)
        key = arguments_key(bound)
        device_code = has_device_code(bound)
        counts = device_code or not device.startswith("cuda")
        started = time.monotonic()
        failure = cache.failure(key)
        if failure is not None:
            ledger.builds.append(BuildRecord(name=name, key=key, ok=False, cached=True,
                                             error=failure, device_code=device_code))
            ledger.libraries.append("")
            raise ExtensionBuildError(f"extension {name} failed to build: {failure}")
        library = cache.library(key, name)
        if library is not None:
            module = _import_library(name, library, is_python_module)
            ledger.builds.append(BuildRecord(name=name, key=key, ok=True, cached=True,
                                             seconds=time.monotonic() - started,
                                             device_code=device_code))
            ledger.libraries.append("")
            return CountingModule(module, ledger, counts) if is_python_module else module
        directory = build_dir / f"{name}-{key}"
        directory.mkdir(parents=True, exist_ok=True)
        bound.arguments["build_directory"] = str(directory)
        try:
            module = real(*bound.args, **bound.kwargs)
        except Exception as exc:
            error = f"{type(exc).__name__}: {_compiler_message(exc)}"
            cache.store_failure(key, error)
            ledger.builds.append(BuildRecord(name=name, key=key, ok=False, error=error,
                                             seconds=time.monotonic() - started,
                                             device_code=device_code))
            ledger.libraries.append("")
            raise
        built = directory / f"{name}.so"
        if built.is_file():
            cache.store_library(key, name, built)
        ledger.builds.append(BuildRecord(name=name, key=key, ok=True,
                                         seconds=time.monotonic() - started,
                                         device_code=device_code))
        ledger.libraries.append(str(built) if built.is_file() else "")
        if mode == "build" or not is_python_module:
            return module
        return CountingModule(module, ledger, counts)

    load_inline.__doc__ = real.__doc__
    cpp_extension.load_inline = load_inline


def _compiler_message(exc: Exception) -> str:
    """The first compiler error line, not the whole ninja log."""
    text = str(exc)
    for line in text.splitlines():
        if "error" in line.lower() and ("error:" in line or "Error" in line):
            return line.strip()[:400]
    return text.strip().splitlines()[0][:400] if text.strip() else type(exc).__name__
