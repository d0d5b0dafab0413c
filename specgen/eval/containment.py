"""Limits on a runner's whole process tree: memory and processes, children included.

A runner (and whatever it forks or spawns) gets a control group of its own before any of its code
runs; what the limit counts is the tree, not one process. Probed once per process, best first:

* **cgroup v2**: a group per runner under one group of this worker (`specgen-<pid>`), with
  `memory.max`, `memory.swap.max = 0` and `pids.max`; `memory.events` says when the kernel's OOM
  killer fired inside it. It needs the memory and pids controllers delegated to where this
  process lives (the parent's `cgroup.subtree_control`), as a systemd unit with `Delegate=yes` or
  a container with a writable cgroup namespace has them.
* **cgroup v1**: the same in the memory and pids hierarchies (`memory.limit_in_bytes`, also
  `memory.memsw.limit_in_bytes` where swap is accounted, `pids.max`; `memory.oom_control`).
* **none**: nothing the kernel enforces for the tree: the runner's own `RLIMIT_NPROC` (counted per
  user, so shared by this worker's runners) and, on the CPU, `RLIMIT_AS` per process; and the
  worker adds up the resident memory of every process of the tree every 100 ms and kills the
  tree when it passes the limit (`tree_rss`).

Each runner removes its group when it ends, and a worker its own at exit; what a worker killed
outright leaves is removed by the next worker's probe on the host (`sweep`).

What a run writes lives on its private tmpfs (`EvalOptions.scratch_mb`, `build_scratch_mb`), whose
pages count as the tree's memory where a cgroup is in force: the disk is never written.
`describe()` says which way is in force and why not a better one; every verdict's evidence of a
limit names the setting.
"""
from __future__ import annotations

import atexit
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from specgen.processes import pid_alive

V2, V1, NONE = "cgroup v2", "cgroup v1", "none"


@dataclass(frozen=True)
class Containment:
    kind: str                       # V2 | V1 | NONE
    detail: str                     # where the groups live, or why no cgroup could be used
    roots: tuple[Path, ...] = ()    # the worker's own groups (v2: one; v1: memory, pids)

    def describe(self) -> str:
        return f"{self.kind}: {self.detail}"


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fs type, options) of every mount."""
    found = []
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                parts = line.split()
                if len(parts) >= 4:
                    found.append((parts[1], parts[2], parts[3]))
    except OSError:
        pass
    return found


def _own_groups() -> dict[str, str]:
    """controller (or "" for v2) -> this process's group path, from /proc/self/cgroup."""
    groups = {}
    try:
        with open("/proc/self/cgroup") as cgroup:
            for line in cgroup:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if not controllers:
                    groups[""] = path
                for name in controllers.split(","):
                    groups[name] = path
    except (OSError, ValueError):
        pass
    return groups


def _write(path: Path, value: str) -> None:
    with open(path, "w") as out:
        out.write(value)


def _read(path: Path) -> str:
    with open(path) as source:
        return source.read()


def _try_v2() -> Containment | str:
    mount = next((point for point, kind, _ in _mounts() if kind == "cgroup2"), None)
    if mount is None:
        return "no cgroup2 file system is mounted"
    own = _own_groups().get("")
    if own is None:
        return "this process is in no cgroup2 group"
    here = Path(mount) / own.lstrip("/")
    try:
        available = _read(here / "cgroup.controllers").split()
    except OSError as exc:
        return f"cannot read {here / 'cgroup.controllers'}: {exc.strerror}"
    missing = [c for c in ("memory", "pids") if c not in available]
    if missing:
        return f"the {' and '.join(missing)} controller(s) are not delegated to {here}"
    sweep(here)
    root = here / f"specgen-{os.getpid()}"
    try:
        root.mkdir(exist_ok=True)
        _write(root / "cgroup.subtree_control", "+memory +pids")
    except OSError as exc:
        _remove(root)
        return f"cannot make {root} a group with memory and pids limits: {exc.strerror}"
    return Containment(V2, f"a group per runner under {root}", (root,))


def _try_v1() -> Containment | str:
    mounts = {kind_opts: point for point, kind, opts in _mounts() if kind == "cgroup"
              for kind_opts in opts.split(",") if kind_opts in ("memory", "pids")}
    groups = _own_groups()
    roots = []
    for controller in ("memory", "pids"):
        if controller not in mounts or controller not in groups:
            return f"no cgroup v1 {controller} hierarchy"
        parent = Path(mounts[controller]) / groups[controller].lstrip("/")
        sweep(parent)
        root = parent / f"specgen-{os.getpid()}"
        try:
            root.mkdir(exist_ok=True)
            probe = root / "probe"
            probe.mkdir(exist_ok=True)
            _remove(probe)
        except OSError as exc:
            for made in roots:
                _remove(made)
            return f"cannot create groups under {root.parent}: {exc.strerror}"
        roots.append(root)
    return Containment(V1, f"a group per runner under {roots[0]} and {roots[1]}", tuple(roots))


STALE_S = 60.0      # a run group this old, of a worker that is gone, is left over


def sweep(parent: Path) -> int:
    """Remove the groups of workers that are gone (killed before they could remove their own):
    on a long-lived host each would otherwise stay, one per worker ever started. Only empty groups
    go (the kernel refuses the rest), and only run groups older than `STALE_S`: a worker of another
    PID namespace whose pid reads as dead here may be making one now. Returns how many went."""
    removed = 0
    try:
        stale = [g for g in parent.glob("specgen-*")
                 if g.name[8:].isdigit() and not pid_alive(int(g.name[8:]))]
    except OSError:
        return 0
    now = time.time()
    for root in stale:
        try:
            runs = [r for r in root.iterdir() if r.is_dir()]
        except OSError:
            continue
        for run in runs:
            try:
                if now - run.stat().st_mtime > STALE_S:
                    run.rmdir()
                    removed += 1
            except OSError:
                pass          # processes still in it, or gone meanwhile
        try:
            root.rmdir()
            removed += 1
        except OSError:
            pass
    return removed


_lock = threading.Lock()
_probed: Containment | None = None


def probe() -> Containment:
    """The best way to limit a runner's tree on this host (tried once per process)."""
    global _probed
    with _lock:
        if _probed is None:
            v2 = _try_v2()
            if isinstance(v2, Containment):
                _probed = v2
            else:
                v1 = _try_v1()
                if isinstance(v1, Containment):
                    _probed = Containment(V1, f"{v1.detail} (no cgroup v2: {v2})", v1.roots)
                else:
                    _probed = Containment(NONE, f"no cgroup v2 ({v2}) and no cgroup v1 ({v1}): "
                                          "per-process rlimits, and the worker polls the tree's "
                                          "resident memory")
            if _probed.roots:
                # Its run groups are gone by then (each runner removes its own); what is left
                # (a run group of a runner still dying) goes at the next sweep.
                atexit.register(_remove_own, os.getpid(), _probed.roots)
        return _probed


def _remove_own(owner: int, roots: tuple[Path, ...]) -> None:
    if os.getpid() == owner:      # not in a forked child leaving by sys.exit: the groups are not its
        for root in roots:
            _remove(root)


def _remove(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


class RunGroup:
    """The control group(s) of one runner tree, or, without cgroups, the tree's root pid."""

    def __init__(self, containment: Containment, name: str, pids_max: int) -> None:
        self.containment = containment
        self.paths: list[Path] = [root / name for root in containment.roots]
        self.root_pid: int | None = None
        self.limit_bytes: int | None = None
        for path in self.paths:
            path.mkdir(exist_ok=True)
        if containment.kind == V2:
            _write(self.paths[0] / "pids.max", str(pids_max))
            try:
                _write(self.paths[0] / "memory.swap.max", "0")
            except OSError:
                pass          # no swap accounting on this host
        elif containment.kind == V1:
            _write(self.paths[1] / "pids.max", str(pids_max))

    def add(self, pid: int) -> None:
        """Put a process in the group (before it runs anything it was not given)."""
        if pid <= 0:
            # cgroup.procs reads 0 as "the writer": that would contain (and later kill) this
            # process instead of the runner.
            raise ValueError(f"no process to put in a control group: pid {pid}")
        self.root_pid = pid
        for path in self.paths:
            _write(path / "cgroup.procs", str(pid))

    def set_memory_limit(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        if self.containment.kind == V2:
            _write(self.paths[0] / "memory.max", str(limit_bytes))
        elif self.containment.kind == V1:
            _write(self.paths[0] / "memory.limit_in_bytes", str(limit_bytes))
            swap = self.paths[0] / "memory.memsw.limit_in_bytes"
            if swap.exists():
                try:
                    _write(swap, str(limit_bytes))
                except OSError:
                    pass

    def memory_bytes(self) -> int:
        """What the tree holds now: the group's charge, or the sum of its resident sets."""
        try:
            if self.containment.kind == V2:
                return int(_read(self.paths[0] / "memory.current"))
            if self.containment.kind == V1:
                return int(_read(self.paths[0] / "memory.usage_in_bytes"))
        except (OSError, ValueError):
            return 0
        return tree_rss(self.root_pid) if self.root_pid is not None else 0

    @property
    def enforced(self) -> bool:
        """The kernel enforces the memory limit (else the worker's poll does)."""
        return self.containment.kind != NONE

    def oom_killed(self) -> bool:
        """The kernel's OOM killer fired inside the group (its memory limit was hit)."""
        try:
            if self.containment.kind == V2:
                for line in _read(self.paths[0] / "memory.events").splitlines():
                    key, _, value = line.partition(" ")
                    if key in ("oom_kill", "oom_group_kill") and int(value) > 0:
                        return True
            elif self.containment.kind == V1:
                for line in _read(self.paths[0] / "memory.oom_control").splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value) > 0
                # Kernels before 4.13 do not count kills: hitting the limit is the sign then
                # (it also counts page cache the kernel reclaimed, so it is the fallback only).
                return int(_read(self.paths[0] / "memory.failcnt")) > 0 and \
                    self.limit_bytes is not None
        except (OSError, ValueError):
            pass
        return False

    def kill(self) -> None:
        """SIGKILL every process in the group (the runner's PID namespace going down does the
        same; this also covers a host without namespaces)."""
        if self.containment.kind == V2:
            try:
                _write(self.paths[0] / "cgroup.kill", "1")
                return
            except OSError:
                pass
        for _ in range(20):
            pids = self._pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.005)

    def _pids(self) -> list[int]:
        if not self.paths:
            return []
        try:
            return [int(p) for p in _read(self.paths[0] / "cgroup.procs").split()]
        except (OSError, ValueError):
            return []

    def close(self) -> None:
        """Kill what is left and remove the group(s)."""
        if not self.paths:
            return
        self.kill()
        for path in self.paths:
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)   # the last processes are still being reaped
        self.paths = []


def tree_pids(root: int) -> list[int]:
    """`root` and every process below it (orphans of a PID namespace stay below its init)."""
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as children:
                    stack += [int(c) for c in children.read().split()]
        except (OSError, ValueError):
            continue
    return found


def tree_rss(root: int) -> int:
    """Memory of `root` and everything below it: the sum of their proportional set sizes (pages
    shared with the template or each other counted once overall, not once per process)."""
    total = 0
    for pid in tree_pids(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as rollup:
                for line in rollup:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError, IndexError):
            continue
    return total
