"""Laying out a sandbox's view, inside its namespaces (eval/sandbox.py says what a sandbox is).

Two levels:

* `python -m specgen.eval.namespaces SPEC_JSON -- PROGRAM ARGS...` is the *setup stage* of a
  template's sandbox, run by `unshare` in fresh user, mount, PID and network namespaces. It builds
  a new root file system from an allow list (`enter`), stays as the PID namespace's init and runs
  PROGRAM (the template) as PID 2, keeping the namespace's capabilities for it: the template
  makes the runners' namespaces.
* `isolate`, `mount_proc` and `drop_privileges` are what a runner forked from the template does
  before any job reaches it: namespaces of its own (mount, PID, IPC, network, UTS), a private
  size-capped /tmp and /dev/shm, a /proc of its own PID namespace, then no capability, an
  unprivileged uid, no_new_privs.

Only the standard library (mount(2), pivot_root(2), unshare(2), mount_setattr(2), prctl(2),
capset(2) through ctypes); nothing here runs candidate code.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import resource
import sys
import time

from specgen.eval.sandbox import SCRATCH, SandboxError, SandboxSpec

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_REC = \
    1, 2, 4, 8, 32, 4096, 16384
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2
_AT_FDCWD, _AT_RECURSIVE = -100, 0x8000
_MOUNT_ATTR_RDONLY = 0x1
_SYS_MOUNT_SETATTR = 442          # the same number on x86-64 and arm64
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine, 155)
_PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP = 4, 38, 24
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWPID, _CLONE_NEWNET = 0x20000000, 0x40000000
_O_PATH = getattr(os, "O_PATH", 0o10000000)
_NEW_ROOT = "/tmp/.specgen-root"  # staged under a tmpfs over /tmp of the setup's own mount ns
_DRIVER_PROC = "/proc/driver/nvidia"


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


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


def _bind(fd: int, target: str, is_dir: bool, writable: bool = False) -> None:
    _make_mountpoint(target, is_dir)
    _mount(f"/proc/self/fd/{fd}", target, None, _MS_BIND | _MS_REC, None)
    _set_readonly(target, not writable, recursive=True)


def _handles(paths: list[str]) -> dict[str, tuple[int, bool]]:
    """O_PATH handles on what a later mount would hide, taken while it is still reachable."""
    handles = {}
    for path in paths:
        try:
            handles[path] = (os.open(path, _O_PATH), os.path.isdir(path))
        except OSError:
            continue
    return handles


def _scratch_tmpfs(target: str, size_mb: int) -> None:
    _mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={size_mb}m,mode=1777")


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


# ---------------------------------------------------------------------- the template's root

def mount_proc() -> None:
    """A fresh /proc for the calling process's PID namespace, with the driver's entries of the
    /proc it replaces bound over its own (a container runtime lays files there, and the CUDA
    driver's library refuses to start on the unmasked view), and /proc/sys bound read-only. The
    rest stays writable: the CUDA driver writes its own entries while it starts (cuInit fails
    with error 304 on a read-only /proc, found on the H200)."""
    kept = os.open(_DRIVER_PROC, _O_PATH) if os.path.isdir(_DRIVER_PROC) else None
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
    if kept is not None:
        if os.path.isdir(_DRIVER_PROC):
            _mount(f"/proc/self/fd/{kept}", _DRIVER_PROC, None, _MS_BIND | _MS_REC, None)
            _set_readonly(_DRIVER_PROC, True, recursive=True)
        os.close(kept)
    _mount("/proc/sys", "/proc/sys", None, _MS_BIND | _MS_REC, None)
    _set_readonly("/proc/sys", True, recursive=True)


def _links_on_the_way(path: str, binds: list[str], found: list[tuple[str, str]],
                      depth: int = 0) -> None:
    """The symbolic links (path, target) that lead `path` where it leads on the host and that no
    bind shows (one in a folder the new root does not hold, as a virtual environment reached
    through a linked folder), each link's target followed the same way. What a path leads to
    must itself be in the view; these lay only the way to it."""
    if depth > 32:
        return                                  # a loop of links: the host cannot follow it either
    current = ""
    parts = [part for part in path.split("/") if part]
    for index, part in enumerate(parts):
        current += "/" + part
        if not os.path.islink(current):
            continue
        target = os.readlink(current)
        if not any(_under(current, bound) for bound in binds):
            found.append((current, target))
        rest = "/".join(parts[index + 1:])
        followed = os.path.normpath(os.path.join(os.path.dirname(current), target, rest))
        _links_on_the_way(followed, binds, found, depth + 1)
        return


def _lay_links(root: str, links: list[tuple[str, str]]) -> None:
    for path, target in links:
        inside = root + path
        if os.path.lexists(inside):
            continue                            # a system link, or laid for another path
        try:
            os.makedirs(os.path.dirname(inside), exist_ok=True)
            os.symlink(target, inside)
        except OSError:
            pass                    # what then fails to start says what it could not find


def _populate_dev(root: str, devices: list[str]) -> None:
    dev = root + "/dev"
    os.makedirs(dev, exist_ok=True)
    _mount("tmpfs", dev, "tmpfs", _MS_NOSUID, "size=1m,mode=0755")
    for node in devices:
        if not os.path.exists(node):
            continue
        fd = os.open(node, _O_PATH)
        try:
            target = root + node
            is_dir = os.path.isdir(node)          # e.g. /dev/nvidia-caps holds the MIG nodes
            _make_mountpoint(target, is_dir)
            _mount(f"/proc/self/fd/{fd}", target, None, _MS_BIND | (_MS_REC if is_dir else 0), None)
        finally:
            os.close(fd)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    os.makedirs(f"{dev}/shm", exist_ok=True)
    _mount("tmpfs", f"{dev}/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64m,mode=1777")


def enter(spec: SandboxSpec) -> None:
    """Make a new root holding only `spec.readonly` (read-only), the device nodes, a fresh /proc
    and a private /tmp, and pivot into it. What is not listed (home folders, /root, /var, the
    checkout beyond the package, other runs' outputs and journals, sockets, keys) does not exist
    inside. Keeps the namespace's capabilities: the template needs them for its runners."""
    wanted = sorted({os.path.realpath(p) for p in spec.readonly if os.path.exists(p)}, key=len)
    binds: list[str] = []
    for path in wanted:
        if _under(SCRATCH, path):
            continue          # / or /tmp itself: the new root's own /tmp is the private scratch
        if any(_under(path, b) and not _under(path, SCRATCH) for b in binds):
            continue          # inside something bound already (and not under the new /tmp)
        binds.append(path)
    links = {p: os.readlink(p) for p in spec.links if os.path.islink(p)}
    handles = _handles(binds)
    ways: list[tuple[str, str]] = []
    for alias in spec.aliases:            # read before /tmp is covered below
        _links_on_the_way(os.path.abspath(alias), binds, ways)
    host_proc = os.open("/proc", _O_PATH)
    _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0700")
    root = _NEW_ROOT
    os.makedirs(root)
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=4m,mode=0755")
    os.makedirs(root + SCRATCH)
    _scratch_tmpfs(root + SCRATCH, spec.scratch_mb)
    for path, target in links.items():
        os.makedirs(os.path.dirname(root + path), exist_ok=True)
        os.symlink(target, root + path)
    hidden = sorted({os.path.realpath(p) for p in spec.hidden}, key=len)

    def inside_hidden(path: str) -> bool:
        return any(path.startswith(h.rstrip("/") + "/") for h in hidden)

    # A bind inside a hidden folder (a worker's cache beside the cluster's sockets, as a local
    # cluster lays them out) is made after the folder is covered, so that it stays in view; a
    # hidden folder inside a bind is covered after the bind, so that it stays hidden.
    inner = [path for path in binds if inside_hidden(path)]
    for path in [p for p in binds if p not in inner]:
        fd, is_dir = handles[path]
        if path in links:
            os.close(fd)
            continue
        _bind(fd, root + path, is_dir)
        os.close(fd)
    _lay_links(root, ways)
    for path in hidden:
        if os.path.isdir(root + path):
            _mount("tmpfs", root + path, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0755")
    for path in inner:
        fd, is_dir = handles[path]
        _bind(fd, root + path, is_dir)
        os.close(fd)
    _populate_dev(root, spec.devices)
    os.makedirs(root + "/proc")
    # Bound from the old root for `mount_proc`, which keeps its driver entries.
    _mount(f"/proc/self/fd/{host_proc}", root + "/proc", None, _MS_BIND | _MS_REC, None)
    os.close(host_proc)
    if os.path.isdir("/sys"):
        fd = os.open("/sys", _O_PATH)
        _bind(fd, root + "/sys", True)
        os.close(fd)
    os.makedirs(root + "/.old")
    _check(_libc.syscall(_SYS_PIVOT_ROOT, root.encode(), (root + "/.old").encode()), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", _MNT_DETACH), "umount the old root")
    os.rmdir("/.old")
    if spec.mount_proc:
        mount_proc()        # over the bound host /proc: this PID namespace's own
    _set_readonly("/", True, recursive=False)
    for sub in ("home", "work", "cache"):
        os.makedirs(os.path.join(SCRATCH, sub), exist_ok=True)
    os.chdir(spec.cwd if os.path.isdir(spec.cwd) else SCRATCH)


# ---------------------------------------------------------------------- a runner's own

def isolate(scratch_mb: int, keep_under_scratch: list[str], uid: int | None) -> None:
    """In a process just forked from the template: new mount, PID, IPC, network and UTS
    namespaces (its next child is PID 1 of the new PID namespace), a private /tmp of
    `scratch_mb` MiB with `keep_under_scratch` (read-only paths the template's /tmp held, a
    PYTHONPATH entry say) bound back, and a private /dev/shm."""
    _check(_libc.unshare(_CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWNET
                         | _CLONE_NEWUTS), "unshare")
    # Taken in the new mount namespace (a bind's source must be a mount of the namespace it
    # is made in), before the new /tmp covers them.
    handles = _handles([p for p in keep_under_scratch if _under(p, SCRATCH)])
    _scratch_tmpfs(SCRATCH, scratch_mb)
    for sub in ("home", "work", "cache"):
        path = os.path.join(SCRATCH, sub)
        os.makedirs(path, exist_ok=True)
        if uid is not None:
            os.chown(path, uid, uid)
    for path, (fd, is_dir) in sorted(handles.items()):
        _bind(fd, path, is_dir)
        os.close(fd)
    _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64m,mode=1777")


def drop_privileges(uid: int | None, max_processes: int | None, dumpable: bool = True) -> None:
    """No capability from here on, in this process and whatever it starts: an empty bounding and
    ambient set, the uid `uid` (changing from 0 to it clears the effective and permitted sets)
    or, without one, capset(2) with nothing; no_new_privs. `max_processes`: RLIMIT_NPROC (the
    kernel exempts nobody here). `dumpable=False`: no process of the same uid may trace this one
    or read its memory through /proc."""
    if max_processes is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for cap in range(64):
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break                 # past the kernel's last capability (EINVAL), or none to drop
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    else:
        header = _CapHeader(version=0x20080522, pid=0)
        data = (_CapData * 2)()
        _check(_libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    if not dumpable:
        make_undumpable()


def make_undumpable() -> None:
    _check(_libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")


def set_hostname(name: str) -> None:
    try:
        _libc.sethostname(name.encode(), len(name))
    except OSError:
        pass


# ---------------------------------------------------------------------- the setup stage

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
        set_hostname("specgen-sandbox")
        if not spec.keep_capabilities:
            drop_privileges(spec.uid, spec.max_processes)
    except (SandboxError, OSError, TypeError, ValueError) as exc:
        sys.stderr.write(f"specgen sandbox: setup failed: {exc}\n")
        os._exit(126)
    _run_as_init(argv[2:])


def _run_as_init(program: list[str]) -> None:
    """Start `program` as PID 2 and wait for it as the namespace's init.

    The kernel shields PID 1 from every signal it has no handler for, so a program that were PID
    1 would survive its own SIGABRT (glibc's abort() then faults: a SIGSEGV). As PID 2 it dies the
    way it would anywhere; init then exits with the shell's convention, 128 + the signal, which
    the worker reads back as that signal. When init exits, the kernel kills whatever is left in
    the namespace (and in every namespace below it).
    """
    child = os.fork()
    if child == 0:
        try:
            os.execvp(program[0], program)
        except BaseException as exc:  # noqa: BLE001 - said, so that the worker's error names it
            try:
                sys.stderr.write(f"specgen sandbox: cannot run {program[0]} inside the sandbox's "
                                 f"view: {exc}\n")
                sys.stderr.flush()
            except BaseException:  # noqa: BLE001
                pass
        finally:
            os._exit(127)
    os.closerange(3, 1 << 16)      # the program's channels are its alone: its end of file is theirs
    wait_as_init(child)


def reap_until(child: int) -> int:
    """Reap every process (orphans too) until `child` ends; its status (128 + a signal)."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if pid == child:
            return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def wait_as_init(child: int) -> None:
    """Reap every process until `child` ends, then exit with its status (128 + a signal)."""
    os._exit(reap_until(child))


if __name__ == "__main__":
    main()
