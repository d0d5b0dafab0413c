"""Child processes of actors: start, watch, stop; none outlives its parent.

Each child runs in its own session (so a signal meant for the parent is not also delivered to
it behind the parent's back) and asks the kernel for SIGTERM when its parent dies
(PR_SET_PDEATHSIG), so killing a node or the scheduler with SIGKILL still takes its children
down. A monitor thread waits on each child and reports its exit at once. Stopping is SIGTERM,
a join with `shutdown_grace_s`, then SIGKILL of the child's whole process group (which also
reaps grandchildren such as candidate subprocesses).

Secrets (a node's join secret, a worker's credential and CURVE keys) never travel in the
environment, which every descendant inherits and `/proc/PID/environ` shows: `ChildProcess(secrets=)`
writes them to a pipe the child inherits as one file descriptor, and the child's `take_secrets()`
reads it once and closes it, so nothing the child starts later (evaluation runners) can read them.
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

from specgen.runtime.private_files import make_private_dir, open_private

log = logging.getLogger(__name__)

PARENT_PID_ENV = "SPECGEN_PARENT_PID"
SECRETS_FD_ENV = "SPECGEN_SECRETS_FD"    # the inherited descriptor of the secrets pipe (a number only)
_PR_SET_PDEATHSIG = 1
_MAX_SECRETS_BYTES = 32 * 1024           # written before the child starts: must fit in the pipe
_secrets: dict[str, str] | None = None


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


def take_secrets() -> dict[str, str]:
    """The secrets this process's parent gave it (`ChildProcess(secrets=...)`); {} when none.

    The pipe is read and closed on the first call and its variable leaves os.environ, so neither
    is inherited by anything this process starts; later calls return the same dict."""
    global _secrets
    if _secrets is None:
        raw_fd = os.environ.pop(SECRETS_FD_ENV, "")
        data = b""
        if raw_fd:
            fd = int(raw_fd)
            try:
                chunks = []
                while chunk := os.read(fd, 65536):
                    chunks.append(chunk)
                data = b"".join(chunks)
            finally:
                os.close(fd)
        _secrets = json.loads(data) if data else {}
    return _secrets


def on_signals(callback: Callable[[int], None],
               signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
    """Call `callback(signum)` for each of `signals`, on a thread of its own. Main thread only.

    A Python signal handler runs on the main thread between two bytecodes: inside a `with lock:`
    of the code it interrupted, or inside itself when a second signal comes. A handler that takes
    any lock (threading.Event.set, an evaluator's cancel) then waits for a lock its own thread
    holds, forever: a worker whose node was killed hung so, busy, and its request was never
    re-queued. Here the interpreter's C handler only writes the signal's number to a pipe
    (signal.set_wakeup_fd) and the Python handler does nothing; the thread reads the pipe and runs
    `callback` outside any interrupted frame."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for signum in signals:
        signal.signal(signum, _noted)

    def pump() -> None:
        while True:
            data = os.read(read_fd, 64)
            if not data:
                return
            for signum in data:
                if signum in signals:
                    callback(signum)

    threading.Thread(target=pump, name="signals", daemon=True).start()


def _noted(signum: int, frame: object) -> None:
    """The Python half of `on_signals`: nothing (the wakeup pipe already has the number)."""


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
        secrets: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = [sys.executable, "-m", module, *(args or [])]
        self.env = {**os.environ, **(env or {}), PARENT_PID_ENV: str(os.getpid())}
        self.env.pop(SECRETS_FD_ENV, None)
        self.secrets = json.dumps(secrets).encode() if secrets else b""
        if len(self.secrets) > _MAX_SECRETS_BYTES:
            raise ValueError(f"secrets of {len(self.secrets)} bytes: at most {_MAX_SECRETS_BYTES}")
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
            # A log shows candidates' errors and tracebacks: private, like the folder it is in.
            make_private_dir(self.log_path.parent)
            out = open_private(self.log_path, "ab")
        env, pass_fds, read_end = self.env, (), -1
        if self.secrets:
            # Written whole before the child starts (it fits in the pipe), so the child reads to
            # EOF; both ends are close-on-exec here, only the child's copy of the read end is not.
            read_end, write_end = os.pipe()
            try:
                os.write(write_end, self.secrets)
            finally:
                os.close(write_end)
            env, pass_fds = {**self.env, SECRETS_FD_ENV: str(read_end)}, (read_end,)
        try:
            self.proc = subprocess.Popen(
                self.argv, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT if out else None, start_new_session=True, pass_fds=pass_fds,
            )
        finally:
            if out is not None:
                out.close()
            if read_end >= 0:
                os.close(read_end)
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
