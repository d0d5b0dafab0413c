"""Runner subprocesses seen from the worker: start, hand one job, watch, kill.

Each runner is its own process session inside its own sandbox (eval/sandbox.py), so killing it
kills whatever it started too. While a
job runs the worker watches three things: the wall-clock deadline (`EvalOptions.timeout_s`), the
runner's resident memory (`EvalOptions.memory_limit_mb` on top of what it held when ready) and a
cancel request. `SparePool` keeps runners started ahead of need; each is used for one job only.
"""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import msgspec

from specgen.eval.protocol import FrameReader, write_frame
from specgen.eval.sandbox import (SCRATCH, SandboxError, SandboxSpec, launcher, map_ids, minimal_env,
                                  python_path)
from specgen.messages import RunnerReady

_POLL_S = 0.1


class RunnerError(RuntimeError):
    """A runner failed to start or to answer (the message says why and which setting applies)."""


def runner_env(device: str, extra: dict[str, str], sandboxed: bool) -> dict[str, str]:
    """The environment of a runner for `device` ("cpu", "cuda:N" or "build").

    Built from an allow list (sandbox.minimal_env), never a copy of the worker's: no SPECGEN_*
    setting, scheduler address, socket path or key reaches candidate code.
    """
    env = minimal_env()
    env["PYTHONPATH"] = python_path()
    env["PYTHONUNBUFFERED"] = "1"
    env["MALLOC_ARENA_MAX"] = "2"  # bounded address space per thread (the CPU memory limit is one)
    if sandboxed:
        # The private tmpfs (sandbox.SCRATCH) is the only writable place inside.
        env.update(HOME=f"{SCRATCH}/home", TMPDIR=SCRATCH, XDG_CACHE_HOME=f"{SCRATCH}/cache",
                   TRITON_CACHE_DIR=f"{SCRATCH}/cache/triton",
                   TORCH_EXTENSIONS_DIR=f"{SCRATCH}/cache/torch_extensions")
    if device.startswith("cuda"):
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:
            listed = [v.strip() for v in visible.split(",") if v.strip()]
            if index >= len(listed):
                raise RunnerError(f"device {device} is not among CUDA_VISIBLE_DEVICES={visible}")
            env["CUDA_VISIBLE_DEVICES"] = listed[index]
        else:
            env["CUDA_VISIBLE_DEVICES"] = str(index)
        env.pop("TRITON_INTERPRET", None)
    else:
        # No GPU for CPU runs and builds: a candidate evaluated on the CPU cannot reach a GPU
        # and a build process creates no CUDA context.
        env["CUDA_VISIBLE_DEVICES"] = ""
        if device == "cpu":
            env["TRITON_INTERPRET"] = "1"
            # One intra-op thread: on a shared or small machine, OpenMP threads waiting for a
            # descheduled sibling turn a 50 us kernel into 10 ms; CPU timings are labelled anyway.
            env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


class RunnerProcess:
    """One runner subprocess and the two pipes to it."""

    def __init__(self, mode: str, device: str, env: dict[str, str], log_path: Path,
                 cwd: Path, sandbox: SandboxSpec | None = None, uid: int | None = None) -> None:
        self.mode = mode
        self.sandboxed = sandbox is not None
        self.log_path = log_path
        self.spawned_at = time.monotonic()
        job_read, self._job_write = os.pipe()
        result_read, result_write = os.pipe()
        inner_device = "cuda:0" if device.startswith("cuda") else "cpu"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cwd.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "specgen.eval.runner", "--mode", mode,
                   "--job-fd", str(job_read), "--result-fd", str(result_write),
                   "--device", inner_device]
        if sandbox is not None:
            command = launcher(sandbox, uid) + command
        with open(log_path, "wb") as log:
            # Its own process session: killing the group kills the launcher and the runner; a
            # sandboxed runner's escaped descendants die with its PID namespace.
            self.proc = subprocess.Popen(
                command, pass_fds=(job_read, result_write), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, env=env, cwd=str(cwd), start_new_session=True)
        os.close(job_read)
        os.close(result_write)
        self._reader = FrameReader(result_read)
        self.runner_pid = self.proc.pid
        self.ready: RunnerReady | None = None
        self.ready_rss = 0
        self._signalled = False
        if sandbox is not None and uid is not None:
            try:
                map_ids(self.proc.pid, uid)
            except (SandboxError, OSError) as exc:
                self.signal_kill()
                self.proc.wait()
                os.close(self._job_write)
                os.close(self._reader.fd)
                raise RunnerError(f"sandbox: {exc}") from None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout_s: float) -> RunnerReady:
        if self.ready is not None:
            return self.ready
        deadline = time.monotonic() + timeout_s
        try:
            ready = self._reader.read(RunnerReady, deadline)
        except (msgspec.DecodeError, ValueError) as exc:
            self.kill()
            raise RunnerError(f"runner sent a malformed ready frame: {exc}") from None
        if ready is None:
            timed_out = not self._reader.eof
            self.kill()
            if timed_out:
                raise RunnerError(f"runner not ready after {timeout_s:.0f} s "
                                  f"(EvalOptions.spawn_timeout_s); log: {self.log_tail()}")
            raise RunnerError(f"runner exited during start-up ({self.exit_description()}); "
                              f"log: {self.log_tail()}")
        self.ready = ready
        self.runner_pid = self._find_runner_pid()
        self.ready_rss = rss_bytes(self.runner_pid)
        return ready

    def _find_runner_pid(self) -> int:
        """The runner's pid as this host sees it: in a sandbox, the launcher's one child."""
        if not self.sandboxed:
            return self.proc.pid
        pid = self.proc.pid
        for _ in range(4):        # launcher -> the namespace's init -> the runner
            child = _first_child(pid)
            if child is None:
                break
            pid = child
        return pid

    def send(self, job: msgspec.Struct) -> None:
        try:
            write_frame(self._job_write, job)
        except OSError as exc:
            raise RunnerError(f"runner {self.pid} is gone ({exc})") from None

    def wait_result(self, kind: type[msgspec.Struct], timeout_s: float, timeout_setting: str,
                    memory_limit_mb: int | None, cancelled: Callable[[], bool]
                    ) -> tuple[msgspec.Struct | None, str | None]:
        """(result, None) or (None, why there is none). Kills the runner on any failure."""
        deadline = time.monotonic() + timeout_s
        limit = None if memory_limit_mb is None else self.ready_rss + memory_limit_mb * 1024 * 1024
        while True:
            try:
                result = self._reader.read(kind, min(deadline, time.monotonic() + _POLL_S))
            except (msgspec.DecodeError, ValueError) as exc:
                self.kill()
                return None, f"runner sent a malformed result: {exc}"
            if cancelled():
                self.kill()
                return None, "cancelled"
            if result is not None:
                self._reap()
                return result, None
            if self._reader.eof:
                self._reap(grace_s=2.0)
                return None, (f"the runner process died ({self.exit_description()}); "
                              f"log: {self.log_tail()}")
            if time.monotonic() >= deadline:
                self.kill()
                return None, f"timed out after {timeout_s:.0f} s ({timeout_setting})"
            if limit is not None:
                rss = rss_bytes(self.runner_pid)
                if rss > limit:
                    self.kill()
                    return None, (f"memory limit exceeded: resident memory reached "
                                  f"{rss / 2**20:.0f} MiB, over {memory_limit_mb} MiB on top of "
                                  f"the runner's start-up (EvalOptions.memory_limit_mb)")

    def _reap(self, grace_s: float = 5.0) -> None:
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def signal_kill(self) -> None:
        """Kill the runner's process session now (safe from any thread; pipes stay open)."""
        if self._signalled:
            return  # once only: a later signal could reach a reused process-group id
        self._signalled = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """Kill the runner and everything in its session, close the pipes; never raises."""
        self.signal_kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for fd in (self._job_write, self._reader.fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self._job_write = self._reader.fd = -1

    def exit_description(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "still running"
        if code > 128 and self.sandboxed:
            code = -(code - 128)      # the sandbox's init reports a signal as 128 + its number
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def log_tail(self, limit: int = 1500) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                size = log.tell()
                log.seek(max(0, size - limit))
                text = log.read().decode("utf-8", "replace")
        except OSError:
            return "(no log)"
        lines = [line for line in text.splitlines() if line.strip()]
        return " | ".join(lines[-12:]) if lines else "(empty)"

    def remove_log(self) -> None:
        try:
            self.log_path.unlink()
        except OSError:
            pass


def _first_child(pid: int) -> int | None:
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as children:
                found = children.read().split()
            if found:
                return int(found[0])
    except (OSError, ValueError):
        pass
    return None


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class SparePool:
    """Runners started ahead of need. `take()` hands out the oldest and starts a replacement."""

    def __init__(self, factory: Callable[[], RunnerProcess], size: int) -> None:
        self._factory = factory
        self._size = size
        self._spares: collections.deque[RunnerProcess] = collections.deque()
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        with self._lock:
            while len(self._spares) < self._size:
                self._spares.append(self._factory())

    def take(self, timeout_s: float) -> tuple[RunnerProcess, float]:
        """A ready runner and the seconds spent waiting for it."""
        began = time.monotonic()
        for attempt in range(2):
            with self._lock:
                if self._closed:
                    raise RunnerError("the worker is closed")
                runner = self._spares.popleft() if self._spares else None
                if self._size > 0:
                    # The replacement starts now, while this runner's job runs.
                    while len(self._spares) < self._size:
                        self._spares.append(self._factory())
            if runner is None:
                runner = self._factory()  # no spares: start-up on the critical path
            try:
                runner.wait_ready(timeout_s)
                return runner, time.monotonic() - began
            except RunnerError:
                runner.remove_log()
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spares, self._spares = list(self._spares), collections.deque()
        for runner in spares:
            runner.kill()
            runner.remove_log()

    def __len__(self) -> int:
        return len(self._spares)
