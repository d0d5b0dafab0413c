"""The worker's side of its template and runners: start the template, fork runners through it,
put each in its control group, talk to it, watch it, kill it.

`Template` is one process per worker (eval/template.py), started inside a sandbox when the host
allows one. `Template.fork(role)` returns a `Runner` at once; `Runner.start` then takes its init's
hello (the kernel gives the pid in this namespace), puts the init in a fresh control group
(eval/containment.py) and lets it start the runner; `wait_ready` waits for the runner's
`RunnerReady`. `Runner.request` sends one request and waits for its reply while watching the
deadline, the tree's memory (polled where no cgroup enforces it) and a cancel; any failure kills
the runner's whole tree and says why, naming the setting. Descriptors that come with a reply are
closed unless the caller asked for them (`fds_expected`). `SparePool` keeps candidate runners
started ahead of need (each is used for one candidate only).

A runner's stdout and stderr go to a memfd of LOG_CAP bytes sealed against growing, not to a file
on the host's disk: the candidate owns its process and can write without end (one run added
5,120 MB to the worker's disk). Past the cap its writes fail; the judge reads the log's end where
the runner's writes left the offset it shares with the judge's descriptor.
"""
from __future__ import annotations

import collections
import fcntl
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from specgen.errors import SpecgenError
from specgen.eval import containment, sandbox
from specgen.eval.protocol import Channel, ChannelClosed, FrameError, Received, close_fds, socket_pair
from specgen.eval.sandbox import SCRATCH, SandboxError, SandboxSpec, SandboxStatus
from specgen.messages import EvalOptions, ForkRunner, Proceed, RunnerExited, RunnerReady, RunnerStarted

_POLL_S = 0.1
_START_CAP_MB = 4096            # the tree's memory before its limit is set from its ready usage
LOG_CAP = 8 * 1024 * 1024       # bytes of a runner's stdout and stderr kept; later writes fail
_TAIL = 1500                    # bytes of a log's end quoted in an error


class RunnerError(SpecgenError, RuntimeError):
    """A runner failed to start or to answer (the message says why and which setting applies)."""


def runner_env(device: str, sandboxed: bool) -> dict[str, str]:
    """The environment of a template for `device` ("cpu" or "cuda:N"), inherited by its runners.

    Built from an allow list (sandbox.minimal_env), never a copy of the worker's: no SPECGEN_*
    setting, scheduler address, socket path or key reaches candidate code."""
    env = sandbox.minimal_env()
    env["PYTHONPATH"] = sandbox.python_path()
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["MALLOC_ARENA_MAX"] = "2"  # bounded address space per thread (the CPU memory limit is one)
    scratch = SCRATCH if sandboxed else None
    if scratch is not None:
        # The private tmpfs is the only writable place inside.
        env.update(HOME=f"{scratch}/home", TMPDIR=scratch, XDG_CACHE_HOME=f"{scratch}/cache",
                   TRITON_CACHE_DIR=f"{scratch}/cache/triton",
                   TORCH_EXTENSIONS_DIR=f"{scratch}/cache/torch_extensions")
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
        # No GPU for CPU runs: a candidate evaluated on the CPU cannot reach a GPU.
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["TRITON_INTERPRET"] = "1"
        # One intra-op thread: on a shared or small machine, OpenMP threads waiting for a
        # descheduled sibling turn a 50 us kernel into 10 ms; CPU timings are labelled anyway.
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _log_tail(path: Path, limit: int = _TAIL) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            log.seek(max(0, size - limit))
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return _tail_text(text)


def _tail_text(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-12:]) if lines else "(empty)"


def capped_log(name: str, cap: int = LOG_CAP) -> int:
    """A memfd for a runner's output that no write can grow past `cap` bytes (sealed: the
    runner holds it too, and could otherwise lift the limit)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, cap)       # sparse: pages exist only where the runner wrote
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def capped_log_tail(fd: int, limit: int = _TAIL) -> str:
    """The end of what was written to a `capped_log`: the runner's writes move the offset of the
    open file it shares with `fd`, so that offset is how far it wrote."""
    try:
        size = os.fstat(fd).st_size
        end = min(os.lseek(fd, 0, os.SEEK_CUR), size)
        data = os.pread(fd, limit, max(0, end - limit)) if end > 0 else b""
    except OSError:
        return "(no log)"
    text = _tail_text(data[:end].decode("utf-8", "replace"))
    if end >= size:
        text += f" | (the log reached its cap of {size >> 20} MiB: later output was dropped)"
    return text


def describe_status(status: int | None) -> str:
    if status is None:
        return "killed"
    if status > 128:
        try:
            return f"killed by signal {signal.Signals(status - 128).name}"
        except ValueError:
            return f"killed by signal {status - 128}"
    return f"exit code {status}"


class Template:
    """One worker's template process (see the module doc)."""

    def __init__(self, device: str, work_dir: Path, options: EvalOptions, sandboxed: bool,
                 cache_dir: Path, hidden: list[str], extra_env: dict[str, str] | None = None
                 ) -> None:
        self.device = device
        self.options = options
        self.sandboxed = sandboxed
        self.work_dir = work_dir
        self.logs = work_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.containment = containment.probe()
        self._serial = itertools.count()
        self._lock = threading.Lock()
        judge_end, template_end = socket_pair()
        self.control = Channel(judge_end, "judge")
        inner = "cuda:0" if device.startswith("cuda") else "cpu"
        uid = sandbox.outer_uid() if sandboxed else None
        keep = [p for p in sandbox.view_paths(str(cache_dir)) if p.startswith(SCRATCH + "/")]
        command = [sys.executable, "-m", "specgen.eval.template",
                   "--control-fd", str(template_end.fileno()), "--device", inner,
                   "--keep", json.dumps(keep)]
        if sandboxed:
            command += ["--sandboxed"] + (["--mapped"] if uid is not None else [])
            spec = SandboxSpec(readonly=sandbox.view_paths(str(cache_dir)),
                               aliases=sandbox.view_aliases(str(cache_dir)), hidden=hidden,
                               links=sandbox.system_links(), devices=sandbox.device_nodes())
            command = sandbox.launcher(spec, uid) + command
        env = runner_env(device, sandboxed)
        env.update(extra_env or {})
        self.log_path = self.logs / f"template-{os.getpid()}-{next(_templates)}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                command, pass_fds=(template_end.fileno(),), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, env=env, cwd=str(work_dir), start_new_session=True)
        template_end.close()
        try:
            if uid is not None:
                sandbox.map_ids(self.proc.pid, uid)
            received = self.control.recv(time.monotonic() + options.spawn_timeout_s, max_fds=0)
        except (SandboxError, OSError, ChannelClosed, FrameError) as exc:
            ended = self._ended(2.0)
            self.close()
            raise RunnerError(f"the template did not start: {exc}{ended}; log: "
                              f"{_log_tail(self.log_path)}") from None
        if received is None or not isinstance(received.message, RunnerReady):
            self.close()
            what = "not ready" if received is None else "sent something else"
            raise RunnerError(f"the template {what} after {options.spawn_timeout_s:.0f} s "
                              f"(EvalOptions.spawn_timeout_s); log: {_log_tail(self.log_path)}")
        self.ready: RunnerReady = received.message

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _ended(self, wait_s: float) -> str:
        """How the template's process ended, waiting up to `wait_s` for it ("" if it did not)."""
        try:
            self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return ""
        return f" (its process ended: {describe_status(self._status())})"

    def fork(self, role: str, label: str = "") -> "Runner":
        """A new runner of `role`, forked now; call `start` (or `wait_ready`) on it next."""
        if not self.alive():
            raise RunnerError(f"the template is gone ({describe_status(self._status())}); log: "
                              f"{_log_tail(self.log_path)}")
        judge_end, runner_end = socket_pair()
        channel = Channel(judge_end, "judge")
        # The kernel stamps a packet with its sender's pid only when the receiving end asks for it
        # before the packet is sent; a hello queued earlier reads as pid 0, and 0 written to a
        # group's cgroup.procs moves *this* process into the runner's group. So ask now, before
        # the init can exist.
        channel.want_credentials(True)
        name = f"{role}-{os.getpid()}-{next(self._serial)}{label}"
        scratch = self.options.build_scratch_mb if role == "build" else self.options.scratch_mb
        address_space = 0
        if self.containment.kind == containment.NONE and not self.device.startswith("cuda") \
                and role != "build":
            address_space = self.options.memory_limit_mb
        request = ForkRunner(role=role, scratch_mb=scratch, max_processes=self.options.max_processes,
                             address_space_mb=address_space,
                             gpu_memory_fraction=self.options.gpu_memory_fraction)
        try:
            log = capped_log(name)
        except OSError as exc:
            runner_end.close()
            channel.close()
            raise RunnerError(f"no log for a {role} runner: {exc}") from None
        with self._lock:
            try:
                self.control.send(request, fds=(runner_end.fileno(), log))
            except (ChannelClosed, OSError) as exc:
                channel.close()
                os.close(log)
                raise RunnerError(f"the template is gone ({exc})") from None
            finally:
                runner_end.close()
        memory = self.options.build_memory_mb if role == "build" else self.options.memory_limit_mb
        return Runner(role, channel, self.logs / f"{name}.log", self, memory, log_fd=log)

    def _status(self) -> int | None:
        code = self.proc.poll()
        if code is None or code >= 0:
            return code
        return 128 - code

    def close(self) -> None:
        self.control.close()
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


_templates = itertools.count()


class Runner:
    """One runner seen from the judge (see the module doc)."""

    def __init__(self, role: str, channel: Channel, log_path: Path, template: Template,
                 memory_limit_mb: int | None, log_fd: int | None = None) -> None:
        """`log_fd`: the runner's `capped_log` (this object closes it); without one, its output
        is read from `log_path`."""
        self.role = role
        self.channel = channel
        self.log_path = log_path
        self._log_fd = log_fd
        self._log_last: str | None = None        # the log's end, read as the runner was killed
        self._log_lock = threading.Lock()
        self.template = template
        self.memory_limit_mb = memory_limit_mb
        self.forked_at = time.monotonic()
        self.ready_at: float | None = None      # when its ready reply came, on this side's clock
        self.init_pid: int | None = None
        self.group: containment.RunGroup | None = None
        self.ready: RunnerReady | None = None
        self.ready_memory = 0
        self.exit_status: int | None = None
        self.dead = False
        self._killed = False

    # ------------------------------------------------------------------ start-up
    def start(self, timeout_s: float) -> None:
        """Take the init's hello, put it in its control group, let it start the runner."""
        if self.init_pid is not None:
            return
        try:
            received = self.channel.recv(time.monotonic() + timeout_s, max_fds=0)
        except (ChannelClosed, FrameError) as exc:
            self.kill()
            raise RunnerError(f"the {self.role} runner did not start ({exc}); log: "
                              f"{self.log_tail()}") from None
        finally:
            self.channel.want_credentials(False)
        if received is None or not isinstance(received.message, RunnerStarted):
            self.kill()
            raise RunnerError(f"the {self.role} runner did not start within {timeout_s:.0f} s "
                              f"(EvalOptions.spawn_timeout_s); log: {self.log_tail()}")
        if not received.sender_pid:
            # No pid the kernel vouches for (None, or 0: not visible from here): the runner could
            # be neither contained nor killed by pid.
            self.kill()
            raise RunnerError(f"the {self.role} runner's hello came without its sender's pid; "
                              f"it cannot be put in a control group")
        self.init_pid = received.sender_pid
        try:
            self.group = containment.RunGroup(self.template.containment,
                                              f"{self.role}-{self.init_pid}",
                                              self.template.options.max_processes)
            self.group.add(self.init_pid)
            cap = self.memory_limit_mb
            if cap is not None:
                self.group.set_memory_limit((cap + _START_CAP_MB) * 1024 * 1024)
            self.channel.send(Proceed())
        except (OSError, ChannelClosed) as exc:
            self.kill()
            raise RunnerError(f"the {self.role} runner could not be put in its control group: "
                              f"{exc}") from None

    @property
    def startup_s(self) -> float | None:
        """Fork to ready as the judge saw it (None before it is ready): not the runner's own
        report, which its process writes."""
        return None if self.ready_at is None else self.ready_at - self.forked_at

    def wait_ready(self, timeout_s: float) -> RunnerReady:
        if self.ready is not None:
            return self.ready
        deadline = time.monotonic() + timeout_s
        self.start(timeout_s)
        try:
            received = self.channel.recv(deadline, max_fds=0)
        except (ChannelClosed, FrameError) as exc:
            self.kill()
            raise RunnerError(f"the {self.role} runner exited during start-up ({exc}); log: "
                              f"{self.log_tail()}") from None
        if received is not None and isinstance(received.message, RunnerExited):
            self.kill()
            raise RunnerError(f"the {self.role} runner exited during start-up "
                              f"({describe_status(received.message.status)}); log: "
                              f"{self.log_tail()}")
        if received is None or not isinstance(received.message, RunnerReady):
            self.kill()
            raise RunnerError(f"the {self.role} runner was not ready after {timeout_s:.0f} s "
                              f"(EvalOptions.spawn_timeout_s); log: {self.log_tail()}")
        self.ready = received.message
        self.ready_at = time.monotonic()
        assert self.group is not None
        self.ready_memory = self.group.memory_bytes()
        if self.memory_limit_mb is not None:
            self.group.set_memory_limit(self.ready_memory + self.memory_limit_mb * 1024 * 1024)
        return self.ready

    # ------------------------------------------------------------------ requests
    def send(self, message: Any, fds: tuple[int, ...] = ()) -> int:
        try:
            return self.channel.send(message, fds)
        except (ChannelClosed, OSError) as exc:
            raise RunnerError(f"the {self.role} runner is gone ({exc})") from None

    def receive(self, deadline: float, timeout_setting: str, cancelled: Callable[[], bool],
                kill_on_cancel: bool = True, fds_expected: int = 0
                ) -> tuple[Received | None, str | None]:
        """(reply, None) or (None, why there is none). Kills the runner on any failure; on a
        cancel too, unless `kill_on_cancel` is False: then the reply is waited for (and dropped),
        so that a runner kept for later is in step with its requests. `fds_expected`: at most
        that many descriptors sent with the reply are kept, in `Received.fds` (the caller closes
        them); every other one is closed as it arrives."""
        was_cancelled = False
        limit_setting = "EvalOptions.build_memory_mb" if self.role == "build" \
            else "EvalOptions.memory_limit_mb"
        while True:
            try:
                received = self.channel.recv(min(deadline, time.monotonic() + _POLL_S),
                                             max_fds=fds_expected)
            except FrameError as exc:
                self.kill()
                return None, f"the {self.role} runner sent a malformed reply: {exc}"
            except ChannelClosed:
                received = None
                self.dead = True
            if received is not None and isinstance(received.message, RunnerExited):
                self.exit_status = received.message.status
                self.dead = True
                received = _dropped(received)
            # A process of the tree killed for memory fails the run even when the runner itself
            # survived (a forked child holding the memory is the one the kernel picks).
            oom = (self.dead or received is not None) and self.group is not None \
                and self.group.oom_killed()
            if oom:
                _dropped(received)
                self.kill()
                return None, (f"memory limit exceeded: the run's processes together reached "
                              f"the limit of {self.memory_limit_mb} MiB on top of what the "
                              f"runner held when ready ({limit_setting})")
            if self.dead:
                self.kill()
                return None, (f"the {self.role} runner died ({describe_status(self.exit_status)}); "
                              f"log: {self.log_tail()}")
            if received is not None:
                return (_dropped(received), "cancelled") if was_cancelled else (received, None)
            if not was_cancelled and cancelled():
                if kill_on_cancel:
                    self.kill()
                    return None, "cancelled"
                was_cancelled = True
            if time.monotonic() >= deadline:
                self.kill()
                return None, f"timed out ({timeout_setting})"
            if self.group is not None and not self.group.enforced and \
                    self.memory_limit_mb is not None:
                used = self.group.memory_bytes()
                if used > self.ready_memory + self.memory_limit_mb * 1024 * 1024:
                    self.kill()
                    return None, (f"memory limit exceeded: the run's processes together held "
                                  f"{used / 2**20:.0f} MiB, over {self.memory_limit_mb} MiB on "
                                  f"top of the runner's start-up ({limit_setting})")

    def request(self, message: Any, deadline: float, timeout_setting: str,
                cancelled: Callable[[], bool], fds: tuple[int, ...] = (), fds_expected: int = 0
                ) -> tuple[Received | None, str | None]:
        """Send `message` (with `fds`) and wait for its reply (see `receive`)."""
        try:
            self.send(message, fds)
        except RunnerError as exc:
            self.kill()
            return None, str(exc)
        return self.receive(deadline, timeout_setting, cancelled,
                            kill_on_cancel=self.role != "reference", fds_expected=fds_expected)

    def pause(self) -> None:
        """Stop every process of the runner (SIGSTOP): while a judge sends it nothing, a
        candidate's threads and children cannot run beside another worker's timing."""
        self._signal_tree(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_tree(signal.SIGCONT)

    def _signal_tree(self, signum: int) -> None:
        if self.init_pid is None or self.dead:
            return
        done: set[int] = set()
        # A second walk finds what forked during the first (a stopped process forks no more).
        for _ in range(3):
            fresh = [pid for pid in containment.tree_pids(self.init_pid) if pid not in done]
            if not fresh:
                return
            for pid in fresh:
                try:
                    os.kill(pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass
            done.update(fresh)

    # ------------------------------------------------------------------ the end
    def signal_kill(self) -> None:
        """Kill the runner's tree now (safe from any thread; the channel stays open)."""
        if self._killed:
            return
        self._killed = True
        if self.group is not None:
            self.group.kill()
        if self.init_pid is not None:
            try:
                if self.template.sandboxed:
                    os.kill(self.init_pid, signal.SIGKILL)   # its PID namespace ends with it
                else:
                    os.killpg(self.init_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self) -> None:
        """Kill the runner's tree, remove its group, close the channel and the log (its end is
        kept for `log_tail`); never raises."""
        self.dead = True
        self.signal_kill()
        self.channel.close()
        if self.group is not None:
            self.group.close()
            self.group = None
        self._close_log(keep_tail=True)

    def log_tail(self) -> str:
        with self._log_lock:
            if self._log_fd is not None:
                return capped_log_tail(self._log_fd)
            if self._log_last is not None:
                return self._log_last
        return _log_tail(self.log_path)

    def _close_log(self, keep_tail: bool) -> None:
        with self._log_lock:
            fd, self._log_fd = self._log_fd, None
            if fd is None:
                return
            if keep_tail:
                self._log_last = capped_log_tail(fd)
            os.close(fd)

    def remove_log(self) -> None:
        self._close_log(keep_tail=False)
        self._log_last = None
        try:
            self.log_path.unlink()
        except OSError:
            pass


def _dropped(received: Received | None) -> None:
    """Nothing: `received` is not handed on, and the descriptors it brought are closed."""
    if received is not None:
        close_fds(received.fds)
        received.fds = []
    return None


class SparePool:
    """Candidate runners started ahead of need; `take()` hands out the oldest ready one and starts
    its replacement. Starting one is a fork of the template plus its CUDA context (tenths of a
    second), done on a thread of its own so that the worker is never blocked by it."""

    def __init__(self, factory: Callable[[], Runner], size: int, timeout_s: float) -> None:
        self._factory = factory
        self._size = size
        self._timeout_s = timeout_s
        self._spares: collections.deque[tuple[Runner, threading.Thread]] = collections.deque()
        self._lock = threading.Lock()
        self._closed = False

    def _launch(self) -> None:
        try:
            runner = self._factory()
        except RunnerError:
            return
        thread = threading.Thread(target=self._warm, args=(runner,), daemon=True,
                                  name=f"specgen-spare-{runner.role}")
        thread.start()
        self._spares.append((runner, thread))

    def _warm(self, runner: Runner) -> None:
        try:
            runner.wait_ready(self._timeout_s)
        except RunnerError:
            pass          # found out by take(), which starts another
        except OSError:
            # The pool was closed (or the runner killed) while this thread waited: its channel's
            # socket is gone under the read. Nothing to report; a take() would start another.
            pass

    def start(self) -> None:
        with self._lock:
            while len(self._spares) < self._size and not self._closed:
                self._launch()

    def take(self, timeout_s: float) -> tuple[Runner, float]:
        """A ready runner and the seconds spent waiting for it."""
        began = time.monotonic()
        for attempt in range(2):
            with self._lock:
                if self._closed:
                    raise RunnerError("the worker is closed")
                taken = self._spares.popleft() if self._spares else None
                while len(self._spares) < self._size:
                    self._launch()
            if taken is None:
                runner = self._factory()
                thread = None
            else:
                runner, thread = taken
            if thread is not None:
                thread.join(timeout_s)
            try:
                runner.wait_ready(timeout_s)
                return runner, time.monotonic() - began
            except RunnerError:
                runner.kill()
                runner.remove_log()
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spares, self._spares = list(self._spares), collections.deque()
        for runner, _ in spares:
            runner.kill()
            runner.remove_log()

    def __len__(self) -> int:
        return len(self._spares)


# ---------------------------------------------------------------------- the sandbox probe

def probe(template: Template) -> SandboxStatus:
    """Whether `template`'s sandbox works for its device: one real runner forked from it, which
    lays out its own namespaces and view, drops its privileges, starts (on a GPU: starts CUDA)
    and answers a request."""
    from specgen.messages import Call

    if not template.sandboxed:
        return SandboxStatus(sandbox.NONE, "the template runs without a sandbox")
    try:
        runner = template.fork("candidate", "-probe")
        runner.wait_ready(template.options.spawn_timeout_s)
    except RunnerError as exc:
        what = "CUDA does not start inside the sandbox" if template.device.startswith("cuda") \
            else "a runner does not start inside the sandbox"
        return SandboxStatus(sandbox.NONE, f"{what}: {exc}")
    # An unloaded candidate runner answers a call with an error: enough to know it serves.
    reply, why = runner.request(Call(index=0, args=[]), time.monotonic() + 60,
                                "the probe's timeout", lambda: False)
    runner.kill()
    if reply is None:
        return SandboxStatus(sandbox.NONE, f"a sandboxed runner does not answer: {why}")
    runner.remove_log()
    uid = sandbox.outer_uid()
    who = f"uids {uid} and {uid + 1}" if uid is not None else "the worker's uid"
    return SandboxStatus(sandbox.NAMESPACES,
                         f"user, mount, PID, IPC and network namespaces per runner as {who}; "
                         f"limits: {template.containment.describe()}")
