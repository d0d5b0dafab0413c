"""Control groups left by workers that are gone: swept when the next worker probes."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from specgen.eval import containment


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def made(path: Path, age_s: float = 0.0) -> Path:
    path.mkdir(parents=True)
    if age_s:
        old = time.time() - age_s
        os.utime(path, (old, old))
    return path


def test_only_old_empty_groups_of_workers_that_are_gone_are_removed(tmp_path: Path) -> None:
    gone = tmp_path / f"specgen-{dead_pid()}"
    old_run = made(gone / "candidate-1", 2 * containment.STALE_S)
    new_run = made(gone / "candidate-2")                  # a worker elsewhere may be making it
    busy_run = made(gone / "reference-3", 2 * containment.STALE_S)
    (busy_run / "cgroup.procs").write_text("1\n")         # not empty: the kernel would refuse
    mine = made(tmp_path / f"specgen-{os.getpid()}" / "candidate-4", 2 * containment.STALE_S)
    unrelated = made(tmp_path / "system.slice", 2 * containment.STALE_S)

    assert containment.sweep(tmp_path) == 1
    assert not old_run.exists() and new_run.exists() and busy_run.exists()
    assert mine.exists() and unrelated.exists() and gone.exists()

    (busy_run / "cgroup.procs").unlink()
    for run in (new_run, busy_run):
        os.utime(run, (0, 0))
    assert containment.sweep(tmp_path) == 3                # both runs, then their worker's group
    assert not gone.exists() and mine.exists()
