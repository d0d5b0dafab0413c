"""The setup stage of a sandbox (eval/sandbox.py), run inside the new namespaces.

`python -m specgen.eval.namespaces SPEC_JSON -- PROGRAM ARGS...` lays out the view a `SandboxSpec`
describes, drops every capability and execs PROGRAM. It runs before any candidate code exists and
uses only the standard library (mount(2), mount_setattr(2) and prctl(2) through ctypes).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import resource
import sys

import time

from specgen.eval.sandbox import INNER_UID, SCRATCH, SandboxError, SandboxSpec

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC = 1, 2, 4, 8, 4096, 16384
_AT_FDCWD, _AT_RECURSIVE = -100, 0x8000
_MOUNT_ATTR_RDONLY = 0x1
_SYS_MOUNT_SETATTR = 442          # the same number on x86-64 and arm64
_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP = 38, 24
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_O_PATH = getattr(os, "O_PATH", 0o10000000)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise SandboxError(f"{what}: {os.strerror(errno)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    _check(_libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                       ctypes.c_ulong(flags), data.encode() if data else None),
           f"mount {source} on {target}")


def _set_readonly(path: str, readonly: bool, recursive: bool) -> None:
    attr = _MountAttr(attr_set=_MOUNT_ATTR_RDONLY if readonly else 0,
                      attr_clr=0 if readonly else _MOUNT_ATTR_RDONLY)
    flags = _AT_RECURSIVE if recursive else 0
    _check(_libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, path.encode(), flags,
                         ctypes.byref(attr), ctypes.sizeof(attr)),
           f"mount_setattr {'ro' if readonly else 'rw'} {path}")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _make_mountpoint(path: str, like_dir: bool) -> None:
    if like_dir:
        os.makedirs(path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            open(path, "w").close()


def _wait_for_id_maps(timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with open("/proc/self/uid_map") as ids:
            if ids.read().strip():
                return
        if time.monotonic() > deadline:
            raise SandboxError(f"no user id map was written within {timeout_s:.0f} s")
        time.sleep(0.001)


def _has_capabilities() -> bool:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16) != 0
    return False


def _drop_privileges(max_processes: int, drop_to_uid: bool) -> None:
    resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for cap in range(64):
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break                 # past the kernel's last capability (EINVAL)
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if drop_to_uid:
        # From here on an unprivileged user outside: no capability, and the process limit
        # applies (the kernel exempts the real root from RLIMIT_NPROC).
        os.setgroups([])
        os.setresgid(INNER_UID, INNER_UID, INNER_UID)
        os.setresuid(INNER_UID, INNER_UID, INNER_UID)
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


_DRIVER_PROC = ("/proc/driver/nvidia",)   # kept from the host's /proc (see eval/sandbox.py)


def _mount_proc() -> None:
    """A fresh /proc for this PID namespace, the host's driver entries bound over its own, and
    /proc/sys bound over itself, so that both stay read-only when /proc itself is made writable
    again (see enter)."""
    kept = {path: os.open(path, _O_PATH) for path in _DRIVER_PROC if os.path.isdir(path)}
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
    for path, fd in kept.items():
        if os.path.isdir(path):
            _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC, None)
        os.close(fd)
    _mount("/proc/sys", "/proc/sys", None, _MS_BIND | _MS_REC, None)


def enter(spec: SandboxSpec) -> None:
    """Lay out the view described by `spec` in this (new) mount namespace and drop privileges.

    After it, exec: the bounding set is empty, so the next program starts with no capability.
    """
    if spec.mount_proc:
        _mount_proc()
    hidden = sorted({os.path.realpath(p) for p in spec.hidden if os.path.isdir(p)}, key=len)
    if spec.hide_dev:
        hidden.append("/dev")   # every device file but the ones listed (no raw disks, no ttys)
    binds = [(os.path.realpath(p), False) for p in spec.readonly if os.path.exists(p)]
    binds += [(p, True) for p in spec.devices if os.path.exists(p)]
    binds += [(os.path.realpath(p), True) for p in spec.writable if os.path.exists(p)]
    # Handles on what must stay reachable, taken before the tmpfs mounts cover it.
    handles = {path: (os.open(path, _O_PATH), os.path.isdir(path), rw) for path, rw in binds}
    _set_readonly("/", True, recursive=True)
    if spec.mount_proc:
        # The CUDA driver's library writes to /proc while it starts (cuInit fails with error 304
        # on a read-only /proc). What a process may write there is its own entries, guarded by
        # their own permissions; the sysctls and the driver's entries stay read-only mounts.
        _set_readonly("/proc", False, recursive=False)
    covered: list[str] = []
    for path in hidden:
        if any(_under(path, c) for c in covered):
            continue              # inside a tmpfs laid already: does not exist any more
        scratch = path == SCRATCH
        size = f"size={spec.scratch_mb}m,mode=1777" if scratch else "size=1m,mode=0755"
        _mount("tmpfs", path, "tmpfs", _MS_NOSUID | (0 if path == "/dev" else _MS_NODEV), size)
        covered.append(path)
    for path, (fd, is_dir, rw) in sorted(handles.items(), key=lambda item: len(item[0])):
        if _under(SCRATCH, path):
            os.close(fd)          # the private scratch itself (or above it) is never covered again
            continue
        if any(_under(path, c) for c in covered) or rw:
            _make_mountpoint(path, is_dir)
            _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC, None)
            _set_readonly(path, not rw, recursive=True)
        os.close(fd)
    if spec.hide_dev:
        os.makedirs("/dev/shm", exist_ok=True)
        _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64m,mode=1777")
        for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                             ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
            os.symlink(target, f"/dev/{name}")
    for path in covered:
        if path != SCRATCH:
            _set_readonly(path, True, recursive=False)
    for sub in ("home", "work", "cache"):
        os.makedirs(os.path.join(SCRATCH, sub), exist_ok=True)
        if spec.drop_to_uid:
            os.chown(os.path.join(SCRATCH, sub), INNER_UID, INNER_UID)
    os.chdir(spec.cwd if os.path.isdir(spec.cwd) else SCRATCH)
    _drop_privileges(spec.max_processes, spec.drop_to_uid)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    again = bool(argv) and argv[0] == "--mapped"
    argv = argv[1:] if again else argv
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: python -m specgen.eval.namespaces SPEC_JSON -- PROGRAM [ARGS...]\n")
        os._exit(2)
    try:
        spec = SandboxSpec(**json.loads(argv[0]))
        _wait_for_id_maps()
        if not _has_capabilities():
            if again:
                raise SandboxError("no capabilities in the new user namespace")
            # Started before the worker wrote the id maps, so this exec gave root no
            # capabilities; now that root is mapped, one more exec does.
            os.execv(sys.executable, [sys.executable, "-m", "specgen.eval.namespaces", "--mapped",
                                      *argv])
        enter(spec)
    except (SandboxError, OSError, TypeError, ValueError) as exc:
        sys.stderr.write(f"specgen sandbox: setup failed: {exc}\n")
        os._exit(126)
    _run_as_init(argv[2:])


def _run_as_init(program: list[str]) -> None:
    """Start `program` as PID 2 and wait for it as the namespace's init.

    The kernel shields PID 1 from every signal it has no handler for, so a runner that were PID 1
    would survive its own SIGABRT (glibc's abort() then faults: a SIGSEGV). As PID 2 it dies the
    way it would anywhere; init then exits with the shell's convention, 128 + the signal, which
    the worker reads back as that signal (runner_process.py). When init exits, the kernel kills whatever
    is left in the namespace.
    """
    child = os.fork()
    if child == 0:
        try:
            os.execvp(program[0], program)
        finally:
            os._exit(127)
    os.closerange(3, 1 << 16)      # the pipes are the runner's alone: its end of file is theirs
    while True:
        try:
            pid, status = os.waitpid(-1, 0)   # reaps orphans too
        except ChildProcessError:
            os._exit(1)
        if pid == child:
            os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status)
                     else os.WEXITSTATUS(status))


if __name__ == "__main__":
    main()
