"""Child processes of actors: start, watch, stop; none outlives its parent.

Each child runs in its own session (so a signal meant for the parent is not also delivered to
it behind the parent's back) and asks the kernel for SIGTERM when its parent dies
(PR_SET_PDEATHSIG), so killing a node or the scheduler with SIGKILL still takes its children
down. A monitor thread waits on each child and reports its exit at once. Stopping is SIGTERM,
a join with `shutdown_grace_s`, then SIGKILL of the child's whole process group (which also
reaps grandchildren such as candidate subprocesses).
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

PARENT_PID_ENV = "SPECGEN_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Call first thing in a child's entry point (a no-op when not started by an actor)."""
    expected = int(os.environ.get(PARENT_PID_ENV, "0") or 0)
    if not expected:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):   # not Linux: the parent-pid check below still applies
        pass
    if os.getppid() != expected:
        os._exit(1)   # the parent died before we could arm the signal


def parent_alive() -> bool:
    expected = int(os.environ.get(PARENT_PID_ENV, "0") or 0)
    return not expected or os.getppid() == expected


def log_tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


class ChildProcess:
    """One child actor process (`python -m MODULE`), watched by a monitor thread."""

    def __init__(
        self,
        name: str,
        module: str,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        on_exit: Callable[["ChildProcess", int], None] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = [sys.executable, "-m", module, *(args or [])]
        self.env = {**os.environ, **(env or {}), PARENT_PID_ENV: str(os.getpid())}
        self.on_exit = on_exit
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.stopping = False
        self._monitor: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> "ChildProcess":
        out = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT if out else None, start_new_session=True,
            )
        finally:
            if out is not None:
                out.close()
        self._monitor = threading.Thread(target=self._watch, name=f"watch-{self.name}", daemon=True)
        self._monitor.start()
        return self

    def _watch(self) -> None:
        assert self.proc is not None
        code = self.proc.wait()
        self._kill_group()
        if self.on_exit is not None:
            try:
                self.on_exit(self, code)
            except Exception:  # noqa: BLE001
                log.exception("exit handler of %s failed", self.name)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _kill_group(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def signal(self, sig: int) -> None:
        if self.alive():
            try:
                self.proc.send_signal(sig)  # type: ignore[union-attr]
            except ProcessLookupError:
                pass

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM, wait up to `grace_s` (setting shutdown_grace_s), then SIGKILL the group."""
        if self.proc is None:
            return None
        self.stopping = True
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            log.warning("%s ignored SIGTERM for %g s (setting shutdown_grace_s): killing it", self.name, grace_s)
            self._kill_group()
            self.proc.wait()
        self._kill_group()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(1.0)
        return self.proc.returncode
