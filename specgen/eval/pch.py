"""A precompiled `torch/extension.h` for the host translation unit of `load_inline` builds.

Every `load_inline` build compiles a `main.cpp` that begins with `#include <torch/extension.h>`,
and parsing those headers is most of that compile: the same work for every extension built with
the same flags. GCC loads a precompiled header instead of parsing when the directory it finds
`torch/extension.h` in also holds a `torch/extension.h.gch` built with flags that mean the same;
when they do not, it reads the header beside it, a copy of torch's. A directory of the two, first
on the include path of `main.cpp` only (nvcc's host pass preprocesses, and so never loads a PCH),
can only make a build faster, never different. Measured (tools/build_bench.py): main.cpp of an
H100 host's CUDA build, 17.9 s -> 8.3 s (p50 of 4); a whole C++ build on a 2-core VM, 32.8 s ->
15.5 s (p50 of 3). GCC still instantiates the headers' templates in each translation unit: that
part stays.

A PCH is code every later build of its flags takes in, so only trusted code makes one: the worker
(`python -m specgen.eval.pch`, a process of its own: the worker imports no torch), never a build
runner, which sees the cache read-only. It makes one only for flags from a fixed list, since
compiler flags can run programs or read and write files (`-fplugin=`, `-B`, `-wrapper`,
`-Wp,-MD,file`, `@file`).
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from specgen.eval.loader import called_name

HEADER = Path("torch") / "extension.h"
# A PCH of torch's headers is about 0.8 GB: one per set of flags that candidates use, a few sets.
MAX_VARIANTS = 6
_MAKE_TIMEOUT_S = 600.0

# Flags that change only how code is compiled: no file named, no program run.
_SAFE_FLAG = re.compile(
    r"-O[0-3sgz]?|-Ofast|-g[0-3]?|-w|-pthread|-DNDEBUG|-std=(c|gnu)\+\+(14|17|20|2a|23|2b)"
    r"|-march=[A-Za-z0-9_.-]+|-mtune=[A-Za-z0-9_.-]+|-m(no-)?(avx|avx2|avx512[a-z]*|fma|f16c"
    r"|sse[0-9.]*|bmi2?|popcnt|lzcnt)"
    r"|-f(no-)?(openmp|fast-math|unroll-loops|math-errno|trapping-math|finite-math-only"
    r"|tree-vectorize|strict-aliasing|omit-frame-pointer|PIC|pic|exceptions|rtti)"
    r"|-fvisibility=(hidden|default)|-W(no-)?[a-z][a-z0-9-]*|-[DU][A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.]*)?")


def normalize(extra_cflags: Any) -> list[str] | None:
    """The flags as torch passes them (each stripped, empty ones dropped: KernelBench candidates
    often write `extra_cflags=[""]`), or None when they are not a list of strings."""
    if extra_cflags is None:
        return []
    if isinstance(extra_cflags, str):
        extra_cflags = [extra_cflags]
    if not isinstance(extra_cflags, (list, tuple)) or not all(isinstance(f, str) for f in extra_cflags):
        return None
    return [f.strip() for f in extra_cflags if f.strip()]


def allowed(extra_cflags: Iterable[str]) -> bool:
    return all(_SAFE_FLAG.fullmatch(flag) for flag in extra_cflags)


@lru_cache(maxsize=None)
def _compiler() -> tuple[str, str]:
    """torch's host compiler (`$CXX`, else `c++`) and its version line: a PCH is only valid for
    the compiler binary that made it."""
    name = os.environ.get("CXX", "c++")
    path = shutil.which(name)
    if path is None:
        return name, ""
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError):
        version = []
    return os.path.realpath(path), "".join(version)


def host_cflags(with_cuda: bool, extra_cflags: list[str]) -> list[str] | None:
    """The flags torch's ninja file gives `main.cpp` for these arguments, less the extension's
    name (`-DTORCH_EXTENSION_NAME`: a macro the headers never read, so one PCH serves every
    name). Written by torch's own writer, so that they are the flags of this torch version."""
    import torch.utils.cpp_extension as cpp_extension

    writer = getattr(cpp_extension, "_write_ninja_file_to_build_library", None)
    if writer is None:
        return None
    import inspect

    values: dict[str, Any] = {
        "name": "specgen_pch", "sources": ["main.cpp"], "extra_cflags": list(extra_cflags),
        "extra_cuda_cflags": [], "extra_sycl_cflags": [], "extra_ldflags": [],
        "extra_include_paths": [], "with_cuda": with_cuda, "with_sycl": False,
        "is_standalone": False}
    with tempfile.TemporaryDirectory(prefix="specgen-pch-flags-") as scratch:
        path = os.path.join(scratch, "build.ninja")
        try:
            parameters = inspect.signature(writer).parameters
            writer(path=path, **{k: v for k, v in values.items() if k in parameters})
            text = Path(path).read_text()
        except Exception:  # noqa: BLE001 - another torch version's writer: no PCH, same builds
            return None
    for line in text.splitlines():
        if line.startswith("cflags = "):
            return [f for f in shlex.split(line[len("cflags = "):])
                    if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    return None


def variant_key(flags: list[str]) -> str:
    import torch

    material = json.dumps([flags, _compiler(), str(torch.__version__)])
    return hashlib.sha256(material.encode()).hexdigest()[:24]


def root(cache_dir: Path) -> Path:
    return cache_dir / "ext" / "pch"


def lookup(cache_dir: Path, with_cuda: bool, extra_cflags: Any,
           extra_include_paths: Any = None) -> Path | None:
    """The include directory holding a PCH for these `load_inline` arguments, if one was made.
    None where a user include directory comes first (it might hold a `torch/extension.h` of its
    own, which a PCH would replace)."""
    flags = normalize(extra_cflags)
    if flags is None or extra_include_paths:
        return None
    host = host_cflags(with_cuda, flags)
    if host is None:
        return None
    directory = root(cache_dir) / variant_key(host)
    return directory if (directory / f"{HEADER}.gch").is_file() else None


def make(cache_dir: Path, with_cuda: bool, extra_cflags: list[str]) -> Path | None:
    """Make the PCH for these arguments (trusted code only: see the module doc). Returns its
    include directory, or None when the flags are not on the list, torch's flags cannot be read,
    or the compiler failed (recorded, not tried again)."""
    import torch.utils.cpp_extension as cpp_extension

    flags = normalize(extra_cflags)
    if flags is None or not allowed(flags):
        return None
    host = host_cflags(with_cuda, flags)
    if host is None:
        return None
    base = root(cache_dir)
    directory = base / variant_key(host)
    if (directory / f"{HEADER}.gch").is_file():
        return directory
    if (directory / "FAILED").is_file():
        return None
    if base.is_dir() and len([p for p in base.iterdir() if not p.name.startswith(".")]) >= MAX_VARIANTS:
        return None
    real = next((Path(p) / HEADER for p in cpp_extension.include_paths()
                 if (Path(p) / HEADER).is_file()), None)
    if real is None:
        return None
    staging = base / f".{directory.name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / HEADER).parent.mkdir(parents=True)
    shutil.copyfile(real, staging / HEADER)
    command = [_compiler()[0], *host, "-Wno-pragma-once-outside-header", "-x", "c++-header",
               str(staging / HEADER), "-o", str(staging / f"{HEADER}.gch")]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_MAKE_TIMEOUT_S)
        failed = done.returncode != 0
        why = done.stderr[-2000:]
    except (OSError, subprocess.SubprocessError) as exc:
        failed, why = True, str(exc)
    if failed:
        (staging / f"{HEADER}.gch").unlink(missing_ok=True)
        (staging / "FAILED").write_text(why)
    for path in [staging, *staging.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)   # read by build runners, other users
    try:
        os.rename(staging, directory)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)          # another worker made it first
    return None if failed else directory


def variants(candidate_text: str) -> list[tuple[bool, list[str]]]:
    """What PCHs a candidate's builds would gain from, read from its source without running it:
    for each C++-only `load_inline(...)` call, its `extra_cflags` where they are written out as a
    literal. Calls with CUDA sources get none made: their build's time is the .cu compile (nvcc
    never loads a PCH), and main.cpp compiles beside it, so a PCH would save CPU seconds only,
    not the build's wall time (tools/build_bench.py)."""
    try:
        tree = ast.parse(candidate_text)
    except (SyntaxError, ValueError):
        return []
    found: list[tuple[bool, list[str]]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and called_name(node.func) == "load_inline"):
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        if "extra_include_paths" in keywords or len(node.args) > 2:
            continue
        with_cuda = "cuda_sources" in keywords and not (
            isinstance(keywords["cuda_sources"], ast.Constant) and not keywords["cuda_sources"].value)
        try:
            flags = normalize(ast.literal_eval(keywords["extra_cflags"])
                              if "extra_cflags" in keywords else None)
        except (ValueError, SyntaxError, TypeError):
            continue
        if not with_cuda and flags is not None and allowed(flags) and (with_cuda, flags) not in found:
            found.append((with_cuda, flags))
    return found


def main(argv: list[str]) -> int:
    """`python -m specgen.eval.pch CACHE_DIR VARIANTS_JSON`: make the PCHs of
    `[[with_cuda, [flag, ...]], ...]`."""
    cache_dir = Path(argv[0])
    for with_cuda, flags in json.loads(argv[1]):
        make(cache_dir, bool(with_cuda), [str(f) for f in flags])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
