"""Child processes: stop escalates to SIGKILL, children die with their parent."""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from specgen.runtime.child_process import ChildProcess, log_tail

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
from specgen.runtime.child_process import ChildProcess, die_with_parent
die_with_parent()
child = ChildProcess("grandchild", "sleeper").start()
Path(sys.argv[1]).write_text(str(child.pid))
while True:
    time.sleep(1)
"""

SLEEPER = """
from specgen.runtime.child_process import die_with_parent
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


SECRETIVE = """
import json, os, subprocess, sys
from pathlib import Path
from specgen.runtime.child_process import SECRETS_FD_ENV, take_secrets
fd = int(os.environ[SECRETS_FD_ENV])
secrets = take_secrets()
assert take_secrets() is secrets
# What this process starts now (an evaluation runner, say) finds neither the variable nor the
# descriptor, even when it is handed every descriptor there is.
probe = (
    "import os, sys\\n"
    "fd = int(sys.argv[1])\\n"
    "try:\\n"
    "    os.fstat(fd); open_fd = True\\n"
    "except OSError:\\n"
    "    open_fd = False\\n"
    "print(int(open_fd), int('SPECGEN_SECRETS_FD' in os.environ), int(sys.argv[2] in open('/proc/self/environ').read()))\\n"
)
out = subprocess.run([sys.executable, "-c", probe, str(fd), secrets["credential"]], close_fds=False,
                     capture_output=True, text=True, check=True).stdout.split()
Path(sys.argv[1]).write_text(json.dumps({"secrets": secrets, "grandchild": out,
                                         "env": SECRETS_FD_ENV in os.environ}))
"""


def test_secrets_reach_the_child_only_and_nothing_it_starts(tmp_path: Path) -> None:
    (tmp_path / "secretive.py").write_text(SECRETIVE)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    report = tmp_path / "report.json"
    secret = "c0ffee" * 10
    child = ChildProcess("secretive", "secretive", [str(report)], env=env, log_path=tmp_path / "s.log",
                         secrets={"credential": secret}).start()
    try:
        assert child.proc.wait(30) == 0, log_tail(tmp_path / "s.log")
    finally:
        child.stop(1.0)
    import json

    data = json.loads(report.read_text())
    assert data["secrets"] == {"credential": secret}
    assert data["env"] is False                          # the variable left os.environ
    assert data["grandchild"] == ["0", "0", "0"]          # no descriptor, no variable, no secret
    assert secret not in Path(f"/proc/{os.getpid()}/environ").read_text()
    assert secret.encode() not in " ".join(child.argv).encode()


BUSY_STOPPER = """
import sys, threading
from pathlib import Path
from specgen.runtime.child_process import on_signals
lock = threading.Lock()
stop = threading.Event()
calls = []

def request_stop(signum):
    calls.append(signum)
    with lock:              # as a real stop does (an Event, an evaluator's cancel)
        stop.set()

on_signals(request_stop)
Path(sys.argv[1]).write_text("ready")
while not stop.is_set():
    with lock:              # the main thread holds the lock most of the time
        pass
print("stopped", flush=True)
"""


def test_a_stop_signal_lands_while_the_main_thread_holds_the_stops_lock(tmp_path: Path) -> None:
    """With `signal.signal(SIGTERM, request_stop)` this process hangs on the first signal: the
    handler runs on the main thread inside its `with lock:` (a worker whose node was killed hung
    so). A burst of signals, as a dying parent and a supervisor may send, stops it too."""
    (tmp_path / "busy_stopper.py").write_text(BUSY_STOPPER)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    ready = tmp_path / "ready"
    child = ChildProcess("busy", "busy_stopper", [str(ready)], env=env, log_path=tmp_path / "b.log").start()
    try:
        wait_for(ready.exists, 30, "the child to start")
        for _ in range(50):
            child.signal(signal.SIGTERM)
        assert child.proc.wait(10) == 0, log_tail(tmp_path / "b.log")
        assert "stopped" in log_tail(tmp_path / "b.log")
    finally:
        child.stop(1.0)
