"""Child processes: stop escalates to SIGKILL, children die with their parent."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from specgen.runtime.process import ChildProcess, log_tail

from tests.runtime.conftest import alive, wait_for

STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ignoring SIGTERM", flush=True)
while True:
    time.sleep(1)
"""

PARENT = """
import sys, time
from pathlib import Path
from specgen.runtime.process import ChildProcess, die_with_parent
die_with_parent()
child = ChildProcess("grandchild", "sleeper").start()
Path(sys.argv[1]).write_text(str(child.pid))
while True:
    time.sleep(1)
"""

SLEEPER = """
from specgen.runtime.process import die_with_parent
import time
die_with_parent()
while True:
    time.sleep(1)
"""


def _modules(tmp_path: Path) -> dict[str, str]:
    for name, text in (("stubborn", STUBBORN), ("parent_actor", PARENT), ("sleeper", SLEEPER)):
        (tmp_path / f"{name}.py").write_text(text)
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}


def test_stop_kills_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    exits: list[int] = []
    child = ChildProcess("stubborn", "stubborn", env=_modules(tmp_path), log_path=tmp_path / "s.log",
                         on_exit=lambda c, code: exits.append(code)).start()
    wait_for(lambda: "ignoring" in log_tail(tmp_path / "s.log"), 20, "the child to start")
    started = time.monotonic()
    code = child.stop(grace_s=0.5)
    assert code == -signal.SIGKILL and time.monotonic() - started < 5
    wait_for(lambda: exits == [-signal.SIGKILL], 5, "the exit to be reported")


def test_grandchild_dies_when_its_parent_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    parent = ChildProcess("parent", "parent_actor", [str(pid_file)], env=_modules(tmp_path)).start()
    try:
        grandchild = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, "the grandchild"))
        assert alive({grandchild})
        os.kill(parent.pid, signal.SIGKILL)
        wait_for(lambda: not alive({grandchild}), 10, "the grandchild to die with its parent")
    finally:
        parent.stop(1.0)
