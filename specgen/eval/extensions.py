"""`torch.utils.cpp_extension.load_inline` as the evaluation sees it: built apart, cached, counted.

Inside a runner, `load_inline` is replaced before the candidate's module runs:

* In a build runner (`mode="build"`, `BuildSession`) it compiles for real, in the runner's
  private /tmp (a size-capped tmpfs: the disk is never written), and the runner sends each
  library back whole; the worker, not the build runner, writes it into the cache
  (`publish_builds`). The build runner runs the candidate's module, so it is as untrusted as the
  candidate: it sees the cache read-only. `specgen/eval/discovery.py` makes the calls a module
  makes later (in `ModelNew.__init__`, in a first `forward`) happen there too.
* In a candidate runner (`mode="run"`) it loads the cached library and compiles nothing: a call
  that no build made (arguments computed at run time) is refused, saying so, and a cached build
  failure is raised again at once. Compiling there would put tens of seconds of nvcc on the
  critical path of the device the runner holds.

The cache is scoped by the candidate's source hash (`<cache>/ext/<sha256>/<key>/`): a library is
only ever loaded by the candidate whose own build produced it, so no candidate can plant code
that another candidate's run would load.

In a candidate runner it returns a proxy of the extension module that counts calls to its functions and
the exceptions they raise, so the judge can tell a kernel that never ran (an extension that
failed to build, with a fallback to PyTorch that did run) from one that did.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any, Callable, Iterator

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


def module_name(name: str, key: str) -> str:
    """The name an extension is compiled and imported under: the candidate's, with its key.
    Two sources of one name in a process would otherwise share their symbols (the first library
    loaded stands in for the second's functions), and torch's own way out, renaming the second
    `name_v1` in the order calls come, differs between a build and a run."""
    return f"{name}_{key[:12]}"


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


class ProbeStop(Exception):
    """Raised by an extension's functions while a build runner probes `ModelNew` (its
    constructor and a forward call on meta tensors): a build runs no extension code then, since
    a kernel handed a meta tensor would read through a null pointer."""


class _BuiltModule(types.ModuleType):
    """A build runner's extension module: itself, except while the build probes the model."""

    def __init__(self, inner: types.ModuleType, session: "BuildSession") -> None:
        super().__init__(inner.__name__, getattr(inner, "__doc__", None))
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_session", session)
        self.__file__ = getattr(inner, "__file__", None)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not callable(value) or isinstance(value, type):
            return value
        session = self._session

        def call(*args: Any, **kwargs: Any) -> Any:
            if session.probing:
                raise ProbeStop(f"{self._inner.__name__}.{name} does not run in a build")
            return value(*args, **kwargs)
        return call

    def __dir__(self) -> list[str]:
        return dir(self._inner)


class BuildSession:
    """`load_inline` in a build runner: each distinct call (by `arguments_key`) compiles once,
    in its own directory of the runner's private /tmp, with the compiler's output kept for the
    error (`verbose` off: torch only puts that output into its exception when it did not print
    it) and the precompiled torch headers of `specgen/eval/pch.py` when the cache has them for its
    flags. A call already built for this candidate (an earlier build of it, for another problem or
    scale) is loaded from the cache, and a cached failure is raised again, as a run would.

    Calls keep their meaning (a failure raises where the candidate can catch it), so a call blocks
    until its build is done; calls made from several threads (`discovery.sweep`) build at once."""

    def __init__(self, real: Callable[..., Any], cache_dir: Path, build_dir: Path,
                 ledger: KernelLedger, scope: str) -> None:
        self.real = real
        self.signature = inspect.signature(real)
        self.cache_dir = cache_dir
        self.cache = ExtensionCache(cache_dir, scope)
        self.build_dir = build_dir
        self.ledger = ledger
        self.probing = False
        self._lock = threading.Lock()
        self._keys: dict[str, threading.Lock] = {}
        self._done: dict[str, tuple[Any, BaseException | None]] = {}

    def _lock_for(self, table: dict[str, threading.Lock], key: str) -> threading.Lock:
        with self._lock:
            return table.setdefault(key, threading.Lock())

    def load_inline(self, *args: Any, **kwargs: Any) -> Any:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        key = arguments_key(bound)
        with self._lock_for(self._keys, key):
            if key not in self._done:
                self._done[key] = self._build(bound, key)
        module, error = self._done[key]
        if error is not None:
            raise error
        return module

    def _record(self, record: BuildRecord, library: str = "") -> None:
        with self._lock:
            self.ledger.builds.append(record)
            self.ledger.libraries.append(library)

    def _build(self, bound: inspect.BoundArguments, key: str
               ) -> tuple[Any, BaseException | None]:
        name = bound.arguments["name"]
        is_python_module = bound.arguments.get("is_python_module", True)
        device_code = has_device_code(bound)
        started = time.monotonic()
        failure = self.cache.failure(key)
        if failure is not None:
            self._record(BuildRecord(name=name, key=key, ok=False, cached=True, error=failure,
                                     device_code=device_code))
            return None, ExtensionBuildError(f"extension {name} failed to build: {failure}")
        cached = self.cache.library(key, name)
        if cached is not None:
            try:
                module = _import_library(module_name(name, key), cached, is_python_module)
            except Exception as exc:  # noqa: BLE001 - reported as the run would see it
                module, error = None, exc
            else:
                error = None
            self._record(BuildRecord(name=name, key=key, ok=True, cached=True,
                                     seconds=time.monotonic() - started, device_code=device_code))
            return self._wrap(module, is_python_module), error
        directory = self.build_dir / f"{name}-{key}"
        directory.mkdir(parents=True, exist_ok=True)
        bound.arguments["build_directory"] = str(directory)
        bound.arguments["verbose"] = False
        bound.arguments["name"] = module_name(name, key)
        self._use_pch(bound)
        built = directory / f"{module_name(name, key)}.so"
        try:
            with _alarm_paused():
                module = self.real(*bound.args, **bound.kwargs)
        except Exception as exc:  # noqa: BLE001 - the compiler's (or torch's) failure, recorded
            self._record(BuildRecord(name=name, key=key, ok=built.is_file(),
                                     error=compiler_message(exc, directory).replace(
                                         module_name(name, key), name),
                                     seconds=time.monotonic() - started,
                                     device_code=device_code),
                         str(built) if built.is_file() else "")
            return None, exc
        self._record(BuildRecord(name=name, key=key, ok=True, seconds=time.monotonic() - started,
                                 device_code=device_code),
                     str(built) if built.is_file() else "")
        return self._wrap(module, is_python_module), None

    def _wrap(self, module: Any, is_python_module: bool) -> Any:
        if module is None or not is_python_module or not isinstance(module, types.ModuleType):
            return module
        return _BuiltModule(module, self)

    def _use_pch(self, bound: inspect.BoundArguments) -> None:
        """Put the precompiled torch headers for this call's flags first on main.cpp's include
        path (`extra_cflags`: nvcc's flags are `extra_cuda_cflags`). Not part of the key: the
        library is the same with or without them."""
        from specgen.eval import pch

        with_cuda = bound.arguments.get("with_cuda")
        if with_cuda is None:
            with_cuda = bool(bound.arguments.get("cuda_sources"))
        try:
            directory = pch.lookup(self.cache_dir, with_cuda, bound.arguments.get("extra_cflags"),
                                   bound.arguments.get("extra_include_paths"))
        except Exception:  # noqa: BLE001 - no PCH: the build as torch makes it
            return
        if directory is not None:
            flags = pch.normalize(bound.arguments.get("extra_cflags")) or []
            bound.arguments["extra_cflags"] = [f"-I{directory}", *flags]


@contextlib.contextmanager
def _alarm_paused() -> Iterator[None]:
    """A compile does not count against the clock of the probe that asked for it
    (discovery.PROBE_SECONDS bounds the candidate's own Python, not the compiler)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    left = signal.alarm(0)
    try:
        yield
    finally:
        if left:
            signal.alarm(left)


NOT_BUILT_AHEAD = ("not built ahead: the runner compiles nothing, and no build of this candidate "
                   "made a load_inline call with these arguments (a name, a source or a flag "
                   "computed at run time, from an input's shape, the GPU, the clock or a random "
                   "number, cannot be built ahead)")


def install(mode: str, cache_dir: Path, build_dir: Path, ledger: KernelLedger,
            scope: str, device: str = "cpu") -> BuildSession | None:
    """Replace load_inline (mode "build" or "run") for the rest of this process; `scope` is the
    candidate's source hash (computed before its module runs). In a build runner it compiles
    (`BuildSession`, returned); in a candidate runner it only loads what a build made, and
    refuses a call that no build made. On a CUDA `device`, calls into an extension without
    device code of its own (C++ that only calls ATen or a library) are not counted as
    custom-kernel launches: the GPU only runs library kernels for it."""
    import torch.utils.cpp_extension as cpp_extension

    real = cpp_extension.load_inline
    if mode == "build":
        session = BuildSession(real, cache_dir, build_dir, ledger, scope)
        cpp_extension.load_inline = _with_doc(session.load_inline, real)
        return session
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
        if library is None:
            ledger.builds.append(BuildRecord(name=name, key=key, ok=False, error=NOT_BUILT_AHEAD,
                                             device_code=device_code))
            ledger.libraries.append("")
            raise ExtensionBuildError(f"extension {name} was {NOT_BUILT_AHEAD}")
        module = _import_library(module_name(name, key), library, is_python_module)
        ledger.builds.append(BuildRecord(name=name, key=key, ok=True, cached=True,
                                         seconds=time.monotonic() - started,
                                         device_code=device_code))
        ledger.libraries.append("")
        return CountingModule(module, ledger, counts) if is_python_module else module

    cpp_extension.load_inline = _with_doc(load_inline, real)
    return None


def _with_doc(function: Callable[..., Any], real: Callable[..., Any]) -> Callable[..., Any]:
    def load_inline(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)
    load_inline.__doc__ = real.__doc__
    load_inline.__signature__ = inspect.signature(real)  # type: ignore[attr-defined]
    return load_inline


# A compiler's diagnostics: `file:line:col: error: ...` (gcc), `file(line): error: ...` (nvcc),
# `#error` and `fatal error` lines, and the linker's.
_DIAGNOSTIC = re.compile(r"\b(error|fatal error)\b\s*:|\berror\b.*#error|undefined reference|"
                         r"\bld(\.\w+)?: |collect2: error", re.IGNORECASE)
# Lines that are build steps, not the compiler's words: ninja's progress and failure lines and the
# command lines themselves (each holds every flag: hundreds of characters of include paths).
_STEP = re.compile(r"^\s*(\[\d+/\d+\]|FAILED:|ninja: )|\s-c\s\S+\s+-o\s|^\S*(c\+\+|g\+\+|gcc|nvcc|clang\+\+)\s+-")
_MESSAGE_CHARS = 2000
_CONTEXT_AFTER = 4


def compiler_message(exc: BaseException, directory: Path | None = None) -> str:
    """What a failed build says, for people: torch's first line ("Error building extension
    'name'") and then the compiler's first error lines with a few lines of context (the source
    line and its caret, the function it is in), without the build's command lines, with the
    build directory taken off file names; at most 2,000 characters. Other failures (no compiler,
    an import error) are their own message."""
    text = str(exc)
    if directory is not None:
        text = text.replace(f"{directory}/", "")
    head, _, rest = text.partition("\n")
    title = head.split(": [", 1)[0].split(": ", 1)[0] if head.startswith("Error building") else head
    lines = ([head[len(title) + 2:]] if head.startswith("Error building") else []) + rest.splitlines()
    lines = [line.rstrip() for line in lines if line.strip() and not _STEP.search(line)]
    picked: list[int] = []
    for index, line in enumerate(lines):
        if _DIAGNOSTIC.search(line):
            before = index - 1 if index and ("In function" in lines[index - 1]
                                              or "In file included" in lines[index - 1]
                                              or "In member function" in lines[index - 1]) else index
            for taken in range(before, min(index + 1 + _CONTEXT_AFTER, len(lines))):
                if taken > index and _DIAGNOSTIC.search(lines[taken]):
                    break
                if taken not in picked:
                    picked.append(taken)
    body = "\n".join(lines[i] for i in picked) if picked else "\n".join(lines[:8])
    message = f"{type(exc).__name__}: {title}" + (f":\n{body}" if body else "")
    return message[:_MESSAGE_CHARS]
