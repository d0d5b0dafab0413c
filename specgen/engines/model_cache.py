"""Build a model directory once and share it: tests, benchmarks and the CLI all call the builders.

A finished directory carries a marker file holding what it was built from; a build goes to a
temporary sibling and is renamed into place, so concurrent callers (pytest workers, a benchmark
beside a test run) never see a half-written model, and a stale or interrupted one is replaced.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable


def cache_root() -> Path:
    """`$SPECGEN_CACHE_DIR`, else `$XDG_CACHE_HOME/specgen`, else `~/.cache/specgen`."""
    root = os.environ.get("SPECGEN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specgen"
    )
    return Path(root)


def is_built(directory: Path, marker_file: str, recipe: dict[str, Any]) -> bool:
    try:
        return json.loads((directory / marker_file).read_text()) == recipe
    except (OSError, ValueError):
        return False


def build_once(target: Path, marker_file: str, recipe: dict[str, Any], build: Callable[[Path], None]) -> str:
    """Return `target` as a string, first running `build(staging_dir)` unless it is already built
    from the same `recipe` (a JSON-able dict written to `marker_file`)."""
    target = target.expanduser().resolve()
    if is_built(target, marker_file, recipe):
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared
    try:
        build(staging)
        (staging / marker_file).write_text(json.dumps(recipe, indent=2) + "\n")
        if target.exists() and not is_built(target, marker_file, recipe):
            shutil.rmtree(target, ignore_errors=True)  # a stale recipe or an interrupted copy
        try:
            os.rename(staging, target)
        except OSError:
            # Another process finished first; its build is identical.
            if not is_built(target, marker_file, recipe):
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return str(target)
