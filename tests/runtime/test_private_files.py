"""Private folders and files: what specgen creates is 0700 / 0600 whatever the umask; what exists
keeps its mode."""
from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from specgen.runtime.private_files import make_private_dir, open_private, touch_private, write_private


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask", [0o000, 0o022, 0o077])
def test_folders_and_files_made_are_private_whatever_the_umask(tmp_path: Path, mask: int) -> None:
    with umask(mask):
        made = make_private_dir(tmp_path / "runs" / "one" / "journal")
        write_private(made / "result.json", b"{}")
        write_private(made / "best_kernel.py", "print(1)\n")
        with open_private(made / "events.jsonl", "ab") as f:
            f.write(b"x\n")
        touch_private(made / "journal.sqlite3")
    for folder in (tmp_path / "runs", tmp_path / "runs" / "one", made):
        assert mode(folder) == 0o700, folder
    for name in ("result.json", "best_kernel.py", "events.jsonl", "journal.sqlite3"):
        assert mode(made / name) == 0o600, name
    assert (made / "best_kernel.py").read_text() == "print(1)\n"


def test_what_exists_keeps_its_mode_and_its_content_as_asked(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    (tmp_path / "mine").mkdir(mode=0o750)
    (tmp_path / "mine").chmod(0o750)
    make_private_dir(tmp_path / "mine" / "run")
    assert mode(tmp_path) == 0o755 and mode(tmp_path / "mine") == 0o750
    assert mode(tmp_path / "mine" / "run") == 0o700
    log = tmp_path / "mine" / "run" / "log"
    log.write_text("first\n")
    log.chmod(0o644)
    with open_private(log, "a") as f:                # appends
        f.write("second\n")
    touch_private(log)                               # leaves it alone
    assert log.read_text() == "first\nsecond\n" and mode(log) == 0o644
    write_private(log, "new\n")                      # replaces the content
    assert log.read_text() == "new\n" and mode(log) == 0o644


def test_a_file_in_the_way_of_a_folder_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError):
        make_private_dir(tmp_path / "file")
    with pytest.raises(ValueError):
        open_private(tmp_path / "x", "r")
