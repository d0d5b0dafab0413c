"""The sandbox every runner lives in: its own user, mount, PID and network namespaces.

A runner executes untrusted candidate code, so the worker starts it as

    unshare --user --mount --pid --fork --kill-child --net
        python -m specgen.eval.namespaces SPEC -- python -m specgen.eval.runner ...

and eval/namespaces.py (the "setup" stage, run inside the new namespaces, still holding the
namespace's capabilities and running no candidate code) lays out the view, then drops every
capability and execs the runner:

- a fresh `/proc` for the new PID namespace (other processes are not there), with what the
  host's `/proc/driver/nvidia` shows bound over the fresh one's: a container runtime lays its own
  files there (a `params` that tells the driver not to create device files, the GPUs the
  container may see) and the driver's library refuses to start on the unmasked view;
- the whole file system read-only (one recursive `mount_setattr`);
- a fresh tmpfs over each hidden path (`/tmp`, `/run`, `/root`, `/home`, HOME, the worker's own
  directories, the cluster's state, key and socket directories): what the cluster keeps there
  (ZeroMQ ipc sockets, CURVE keys, journals, other candidates' files) does not exist inside;
- the paths the runner needs (the Python installation, `sys.path`, the evaluation cache) bound
  back read-only where a hidden path covered them, and a build directory bound writable for a
  build runner;
- `/tmp` a private, size-capped tmpfs: HOME, caches and the job's files live there and vanish
  with the run (a candidate that fills it gets ENOSPC, nobody else does);
- no network at all (a new network namespace: loopback down, no route to the scheduler), a
  process-count limit (a fork bomb meets EAGAIN), an empty capability bounding set and
  no_new_privs, so the candidate cannot undo any of this;
- the setup stage stays as the namespace's init (PID 1) and the runner is PID 2: when the runner
  ends, init ends, and the kernel kills every process left in the namespace, a double-forked
  `setsid` grandchild included; the worker kills the whole group the same way.

Outside the namespace, the runner is an unprivileged user (U, one per worker process, when the
worker is root: the worker writes the id maps, see `map_ids`), so even a file a hidden path
missed is only readable where it is world-readable, and the process limit counts its processes
alone.
Where namespaces cannot be created (a container without the right), `probe()` says why and the
worker refuses untrusted candidates unless its options allow running them unsandboxed.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import specgen

NAMESPACES = "namespaces"
NONE = "none"

# Always hidden: where a host keeps sockets, keys, per-user state and other processes' scratch.
DEFAULT_HIDDEN = ("/tmp", "/var/tmp", "/run", "/root", "/home")   # and /dev, always
SCRATCH = "/tmp"                 # the private writable directory, inside the sandbox
UID_BASE = 2_000_000             # outer uid of a root worker's runners: UID_BASE + worker pid


class SandboxError(RuntimeError):
    """The sandbox could not be set up (the message says which step failed and why)."""


@dataclass
class SandboxSpec:
    """What the setup stage lays out; travels to it as JSON on its command line."""

    hidden: list[str] = field(default_factory=list)     # covered by an empty tmpfs
    readonly: list[str] = field(default_factory=list)   # bound back read-only where covered
    writable: list[str] = field(default_factory=list)   # bound back writable (a build directory)
    devices: list[str] = field(default_factory=list)    # the only device files under /dev
    scratch_mb: int = 1024                              # size of the private /tmp
    max_processes: int = 512                            # RLIMIT_NPROC: processes and threads
    cwd: str = SCRATCH + "/work"
    drop_to_uid: bool = False                           # become INNER_UID once laid out
    hide_dev: bool = True                               # only `devices` under /dev
    mount_proc: bool = True                             # a fresh /proc (see the module doc)


@dataclass(frozen=True)
class SandboxStatus:
    kind: str                     # NAMESPACES or NONE
    detail: str                   # why NONE, or how the namespaces are made


def needed_paths() -> list[str]:
    """What any runner must read: the interpreter, its libraries and the specgen package."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix,
             str(Path(sys.executable).resolve().parent),
             str(Path(specgen.__file__).resolve().parent.parent)}
    paths.update(p for p in sys.path if p and os.path.exists(p))
    return sorted(str(Path(p).resolve()) for p in paths)


def outer_uid() -> int | None:
    """The unprivileged uid a root worker's runners run as (one per worker process); None when
    the worker is not root (then its runners run as the worker's own uid)."""
    return UID_BASE + os.getpid() if os.geteuid() == 0 else None


INNER_UID = 1                    # the runner's uid inside; mapped to outer_uid() outside


def map_ids(launcher_pid: int, uid: int, timeout_s: float = 10.0) -> None:
    """Write the user namespace's id maps of a launcher started with `launcher(..., uid)`:
    root inside is root outside (only until the setup stage has laid out the view; it has no
    capability outside its namespaces) and INNER_UID is `uid`. A root worker writes them because
    util-linux can map a second id only through newuidmap, which hosts rarely have."""
    own = os.readlink("/proc/self/ns/user")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if os.readlink(f"/proc/{launcher_pid}/ns/user") != own:
                break
        except OSError as exc:
            raise SandboxError(f"the launcher exited before its namespaces existed ({exc})") from None
        if time.monotonic() > deadline:
            raise SandboxError(f"the launcher made no user namespace within {timeout_s:.0f} s")
        time.sleep(0.001)
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{launcher_pid}/{name}", "w") as out:
            out.write(f"0 0 1\n{INNER_UID} {uid} 1\n")


def device_nodes() -> list[str]:
    """The device files a runner may open: the harmless ones and the GPUs' (CUDA needs them)."""
    nodes = [f"/dev/{name}" for name in ("null", "zero", "full", "random", "urandom")]
    try:
        nodes += sorted(f"/dev/{name}" for name in os.listdir("/dev") if name.startswith("nvidia"))
    except OSError:
        pass
    return [n for n in nodes if os.path.exists(n)]


def launcher(spec: SandboxSpec, uid: int | None) -> list[str]:
    """The command prefix that starts `python -m specgen.eval.sandbox` in fresh namespaces."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise SandboxError("util-linux `unshare` is not installed")
    # With a uid, the id maps are written from outside (map_ids) and the setup stage waits for
    # them; without, the worker is not root and its own uid becomes root inside.
    mapping = [] if uid is not None else ["--map-root-user"]
    spec.drop_to_uid = uid is not None
    return [unshare, "--user", *mapping, "--mount", "--pid", "--fork",
            "--kill-child", "--net", "--propagation", "private",
            sys.executable, "-m", "specgen.eval.namespaces", json.dumps(asdict(spec)), "--"]


_probe_lock = threading.Lock()
_probed: SandboxStatus | None = None


def probe() -> SandboxStatus:
    """Whether this host can sandbox runners; tried once per process with a real setup."""
    global _probed
    with _probe_lock:
        if _probed is not None:
            return _probed
        try:
            command = launcher(SandboxSpec(hidden=list(DEFAULT_HIDDEN), readonly=needed_paths(),
                                           scratch_mb=4, devices=device_nodes()), outer_uid())
        except SandboxError as exc:
            _probed = SandboxStatus(NONE, str(exc))
            return _probed
        check = ("import os,socket; s=socket.socket(); s.settimeout(1);"
                 "ok=os.getppid()==1 and s.connect_ex(('127.0.0.1',9))!=0;"
                 "open('/tmp/x','w').write('x'); print('sandbox-ok' if ok else 'sandbox-leaky')")
        try:
            child = subprocess.Popen([*command, sys.executable, "-c", check], text=True, cwd="/",
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env={**minimal_env(), "PYTHONPATH": python_path()})
            try:
                if outer_uid() is not None:
                    map_ids(child.pid, outer_uid())   # type: ignore[arg-type]
                stdout, stderr = child.communicate(timeout=60)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
            done = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
        except (OSError, subprocess.TimeoutExpired, SandboxError) as exc:
            _probed = SandboxStatus(NONE, f"namespaces could not be created: {exc}")
            return _probed
        if done.returncode == 0 and done.stdout.strip() == "sandbox-ok":
            uid = outer_uid()
            who = f"uid {uid}" if uid is not None else "the worker's uid"
            _probed = SandboxStatus(NAMESPACES, f"user, mount, PID and network namespaces as {who}")
        else:
            lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
            _probed = SandboxStatus(NONE, "namespaces could not be created: "
                                    + (lines[-1][:300] if lines else f"exit {done.returncode}"))
        return _probed


_cuda_probed: dict[str, SandboxStatus] = {}


def probe_cuda(visible_device: str) -> SandboxStatus:
    """`probe()`, and for a GPU worker also whether CUDA starts inside the sandbox on that GPU
    (`visible_device`: its CUDA_VISIBLE_DEVICES value). A host whose driver will not start in
    these namespaces gets a sandbox of kind NONE saying so, so that GPU candidates are refused
    with that reason (or run unsandboxed where the operator allows it) instead of all failing."""
    base = probe()
    if base.kind != NAMESPACES:
        return base
    with _probe_lock:
        if visible_device in _cuda_probed:
            return _cuda_probed[visible_device]
        check = ("import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize();"
                 "print('sandbox-cuda-ok')")
        env = {**minimal_env(), "CUDA_VISIBLE_DEVICES": visible_device,
               "PYTHONPATH": python_path()}
        env.pop("TRITON_INTERPRET", None)
        status = base
        try:
            command = launcher(SandboxSpec(hidden=list(DEFAULT_HIDDEN), readonly=needed_paths(),
                                           scratch_mb=64, devices=device_nodes()), outer_uid())
            child = subprocess.Popen([*command, sys.executable, "-c", check], text=True, cwd="/",
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
            try:
                if outer_uid() is not None:
                    map_ids(child.pid, outer_uid())   # type: ignore[arg-type]
                out, _ = child.communicate(timeout=180)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
            if "sandbox-cuda-ok" not in out:
                lines = [line for line in out.splitlines() if line.strip()]
                status = SandboxStatus(NONE, "CUDA does not start inside the sandbox: "
                                       + (lines[-1][:300] if lines else f"exit {child.returncode}"))
        except (OSError, subprocess.TimeoutExpired, SandboxError) as exc:
            status = SandboxStatus(NONE, f"CUDA does not start inside the sandbox: {exc}")
        _cuda_probed[visible_device] = status
        return status


# The only variables a runner inherits from its worker (by exact name or prefix): what torch,
# CUDA, Triton, compilers and BLAS read. Never SPECGEN_*, never anything that looks like a secret.
_PASS_NAMES = {"PATH", "LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "CC", "CXX", "CUDA_HOME",
               "CUDA_PATH", "VIRTUAL_ENV"}
_PASS_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "TORCH_", "TRITON_", "OMP_", "MKL_", "OPENBLAS_",
                  "KMP_", "GOMP_")
_SECRET_WORDS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "CREDENTIAL", "AUTH")


def python_path() -> str:
    """PYTHONPATH for a runner: the specgen package and whatever the worker's own PYTHONPATH adds
    (a host whose packages come that way runs its runners the same way)."""
    package_root = str(Path(specgen.__file__).resolve().parent.parent)
    return os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)


def minimal_env(source: dict[str, str] | None = None) -> dict[str, str]:
    """The allow-listed part of `source` (default: this process's environment)."""
    source = os.environ if source is None else source
    env = {}
    for name, value in source.items():
        upper = name.upper()
        if upper.startswith("SPECGEN_") or any(word in upper for word in _SECRET_WORDS):
            continue
        if name in _PASS_NAMES or name.startswith(_PASS_PREFIXES):
            env[name] = value
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return env
