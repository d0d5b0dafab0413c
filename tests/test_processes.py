"""Whether a pid names a live process."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from specgen.processes import pid_alive


def test_a_live_process_a_zombie_and_a_reaped_one() -> None:
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while pid_alive(child.pid) and time.monotonic() < deadline:   # exited, not yet reaped
        time.sleep(0.05)
    assert not pid_alive(child.pid), "a zombie counts as gone"
    child.wait()
    assert not pid_alive(child.pid)
