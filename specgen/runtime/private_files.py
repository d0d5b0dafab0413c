"""Folders and files that only their owner can read: run outputs, journals, the scheduler's state.

A run's folder holds the problem, every candidate's source, the best kernel and the journals, so
whatever specgen creates there is mode 0700 (folders) and 0600 (files). The mode is set again
after creation because `mkdir(mode=)` and `os.open(mode=)` are masked by the umask; the
process-wide umask itself is left alone (every thread shares it, every child inherits it).

A folder or file that already exists keeps its mode: it is the user's, and so is its mode.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import IO

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def make_private_dir(path: Path | str) -> Path:
    """`path.mkdir(parents=True, exist_ok=True)`, each folder it creates mode 0700."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            continue      # made meanwhile by another process: it set the mode
        os.chmod(folder, PRIVATE_DIR_MODE)
    if not path.is_dir():
        raise FileExistsError(f"{path} exists and is not a folder")
    return path


def open_private(path: Path | str, mode: str = "wb") -> IO:
    """`open(path, mode)` for writing ("w", "wb", "a", "ab"); a file it creates is mode 0600."""
    if mode not in ("w", "wb", "a", "ab"):
        raise ValueError(f"open_private writes: mode w, wb, a or ab, not {mode!r}")
    flags = os.O_WRONLY | os.O_CLOEXEC | (os.O_APPEND if mode.startswith("a") else os.O_TRUNC)
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    except FileExistsError:
        fd = os.open(path, flags)
    else:
        os.fchmod(fd, PRIVATE_FILE_MODE)
    return os.fdopen(fd, mode)


def write_private(path: Path | str, data: bytes | str) -> None:
    """`Path.write_bytes` / `write_text`; a file it creates is mode 0600."""
    with open_private(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


def touch_private(path: Path | str) -> None:
    """Create `path` empty, mode 0600, unless it exists (for files a library then opens: an SQLite
    database, whose -wal and -shm files take the database file's mode)."""
    open_private(path, "ab").close()
