"""The sandbox every runner lives in: namespaces of its own and a view of the host that holds only
what a run needs.

A worker starts one *template* process per device (eval/template.py) as

    unshare --user --mount --pid --fork --kill-child --net
        python -m specgen.eval.namespaces SPEC -- python -m specgen.eval.template ...

The setup stage (eval/namespaces.py, run inside the new namespaces, no candidate code) builds a
new root file system from an allow list and pivots into it:

- read-only: the system directories (/usr, /etc and the /bin, /lib links), the Python
  installation and the directories on `sys.path`, the `specgen` package directory alone (not the
  checkout around it: not `./specgen-runs/`, not journals, not another run's outputs), the
  evaluation cache (built libraries), CUDA_HOME and LD_LIBRARY_PATH entries, /sys; each bound
  where it really is, with the symbolic links that lead there from the names the programs use
  laid again (an interpreter of a virtual environment reached through a linked folder);
- /dev with only null, zero, full, random, urandom and the `nvidia*` nodes;
- a fresh /proc of the new PID namespace (the host's driver entries bound over its own: a
  container runtime lays its files there), left writable because the CUDA driver writes its own
  entries while it starts; its /sys stays a read-only bind;
- a private /tmp tmpfs (size-capped) for HOME, TMPDIR and the caches;
- nothing else: no /root, /home, /var, /run, the worker's work directory, sockets, keys.

The template keeps the namespace's capabilities (it runs no candidate code) and forks each
runner, which makes namespaces of its own (mount, PID, IPC, network, UTS), a private /tmp of
`EvalOptions.scratch_mb` (`build_scratch_mb` for a build) and /dev/shm, a /proc of its own, and
then drops every capability, takes an unprivileged uid (candidates and builds one, the reference
another) and sets no_new_privs before any job reaches it. Limits on its process tree come from
eval/containment.py. A runner is PID 2 of its own PID namespace, the child of that namespace's
init: when the init ends, the namespace and everything the candidate started in it end.

Outside, a root worker's runners are unprivileged users (UID_BASE + 2 x the worker's pid for
candidates and builds, + 1 for its reference runners): the worker writes the namespace's id maps
itself (util-linux maps more than one id only through newuidmap, which hosts rarely have). So a
file the view did show is readable only where it is world-readable. RLIMIT_NPROC counts per uid,
so it is shared by one worker's candidate and build runners; the per-run process limit is the
control group's (eval/containment.py). The runner's environment is an allow list (PATH, locale,
CUDA/NVIDIA/TORCH/TRITON/OMP/BLAS variables; never `SPECGEN_*` or anything named like a key,
token or secret).

Where namespaces cannot be created (a container without the right), the worker says why and
refuses untrusted candidates unless its options allow running them unsandboxed. The verdict does
not rest on the sandbox either way: it rests on the judge (eval/judge.py), a process candidate
code never runs in.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import specgen
from specgen.errors import SpecgenError

NAMESPACES = "namespaces"
NONE = "none"

SCRATCH = "/tmp"                 # the private writable directory, inside the sandbox
UID_BASE = 2_000_000             # outer uids of a root worker's runners: UID_BASE + 2 x its pid
INNER_UID = 1                    # candidate and build runners, inside; outer_uid() outside
INNER_UID_REF = 2                # reference runners, inside; outer_uid() + 1 outside
SYSTEM_PATHS = ("/usr", "/etc", "/opt/conda", "/usr/local")
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class SandboxError(SpecgenError, RuntimeError):
    """The sandbox could not be set up (the message says which step failed and why)."""


@dataclass
class SandboxSpec:
    """What the setup stage lays out; travels to it as JSON on its command line."""

    readonly: list[str] = field(default_factory=list)   # bound read-only into the new root
    aliases: list[str] = field(default_factory=list)    # paths as the programs name them, whose
                                                        # symbolic links are made again inside
    hidden: list[str] = field(default_factory=list)     # covered by an empty tmpfs (inside a bind)
    links: list[str] = field(default_factory=list)      # top-level symbolic links kept as links
    devices: list[str] = field(default_factory=list)    # the only device files under /dev
    scratch_mb: int = 64                                # size of the template's own /tmp
    max_processes: int = 512                            # RLIMIT_NPROC when privileges drop here
    cwd: str = SCRATCH + "/work"
    uid: int | None = None                              # become this uid when privileges drop
    keep_capabilities: bool = True                      # the template makes its runners' namespaces
    mount_proc: bool = True                             # a fresh /proc (see the module doc)


@dataclass(frozen=True)
class SandboxStatus:
    kind: str                     # NAMESPACES or NONE
    detail: str                   # why NONE, or how the namespaces are made


def package_dir() -> str:
    return str(Path(specgen.__file__).resolve().parent)


def view_paths(cache_dir: str | None = None, extra: list[str] | None = None) -> list[str]:
    """What the sandbox's root holds, read-only: the system, the interpreter and its libraries,
    the `specgen` package (alone: the directory around it is not shown), the cache. Resolved:
    a bind shows a directory where it really is (`view_aliases` lays the links to it)."""
    return sorted({str(Path(p).resolve()) for p in _view_sources(cache_dir, extra)})


def view_aliases(cache_dir: str | None = None, extra: list[str] | None = None) -> list[str]:
    """The paths by which the sandbox's programs reach what `view_paths` shows, where they pass
    through a symbolic link: the interpreter (`sys.executable` of a virtual environment reached
    through a linked folder), its prefixes, `sys.path`, the environment's folders. Without the
    links inside, the interpreter's own path did not exist there and the template could not
    start."""
    named = {sys.executable, *_view_sources(cache_dir, extra),
             *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)}
    for name in ("VIRTUAL_ENV", "CC", "CXX"):
        if os.environ.get(name):
            named.add(os.environ[name].split(" ")[0])
    return sorted(p for p in {os.path.abspath(p) for p in named if os.path.isabs(p)}
                  if os.path.exists(p) and os.path.realpath(p) != p)


def _view_sources(cache_dir: str | None, extra: list[str] | None) -> set[str]:
    """`view_paths` as named (before resolving)."""
    package = package_dir()
    around = str(Path(package).parent)
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix,
             str(Path(sys.executable).resolve().parent), package, *SYSTEM_PATHS}
    prefix = os.path.realpath(sys.prefix)
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        real = os.path.realpath(entry)
        # Nothing else of the checkout: a test runner or a PYTHONPATH may put its folders on
        # sys.path. A virtual environment inside it stays (the interpreter's libraries).
        if _inside(real, around) and not _inside(real, prefix) and not _inside(real, package):
            continue
        paths.add(entry)
    for name in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(name):
            paths.add(os.environ[name])
    paths.update(p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p)
    paths.update(toolchain_prefixes(around))
    if cache_dir:
        paths.add(cache_dir)
    paths.update(extra or [])
    return {p for p in paths if os.path.exists(p)}


# What builds and Triton's launcher compile with: found where the worker would find them.
_TOOLS = ("cc", "gcc", "c++", "g++", "clang", "nvcc", "ninja", "ld")


def toolchain_prefixes(checkout: str) -> list[str]:
    """The installation folders (the parent of `bin/`) of the compilers and build tools a runner
    uses, where they live outside the system folders (e.g. a compiler under /opt/gcc): a
    compiler needs its own lib/ and libexec/ as well as its binary."""
    found = set()
    names = [os.environ.get(n, "").split(" ")[0] for n in ("CC", "CXX")] + list(_TOOLS)
    for name in filter(None, names):
        path = shutil.which(name)
        if path is None:
            continue
        binary = Path(path).resolve()
        prefix = binary.parent.parent if binary.parent.name == "bin" else binary.parent
        text = str(prefix)
        if text in ("/", "/root", str(Path.home())) or text.startswith(checkout) \
                or any(text == p or text.startswith(p + "/") for p in SYSTEM_PATHS):
            continue
        found.add(text)
    return sorted(found)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def system_links() -> list[str]:
    return [p for p in SYSTEM_LINKS if os.path.lexists(p)]


def outer_uid() -> int | None:
    """The unprivileged uid a root worker's candidate and build runners run as (its reference
    runners: this + 1); None when the worker is not root (then every runner runs as the worker's
    own uid, mapped to root inside)."""
    return UID_BASE + 2 * os.getpid() if os.geteuid() == 0 else None


def runner_uid(role: str) -> int | None:
    """The uid a runner of `role` takes inside, or None where only one id is mapped."""
    if outer_uid() is None:
        return None
    return INNER_UID_REF if role == "reference" else INNER_UID


def map_ids(launcher_pid: int, uid: int, timeout_s: float = 10.0) -> None:
    """Write the user namespace's id maps of a launcher started with `launcher(..., uid)`: root
    inside is root outside (only for the setup stage and the template, which run no candidate
    code and hold no capability outside their namespaces), INNER_UID is `uid` and INNER_UID_REF
    is `uid + 1`."""
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
            out.write(f"0 0 1\n{INNER_UID} {uid} 1\n{INNER_UID_REF} {uid + 1} 1\n")


def device_nodes() -> list[str]:
    """The device files a runner may open: the harmless ones and the GPUs' (CUDA needs them)."""
    nodes = [f"/dev/{name}" for name in ("null", "zero", "full", "random", "urandom")]
    try:
        nodes += sorted(f"/dev/{name}" for name in os.listdir("/dev") if name.startswith("nvidia"))
    except OSError:
        pass
    return [n for n in nodes if os.path.exists(n)]


def launcher(spec: SandboxSpec, uid: int | None) -> list[str]:
    """The command prefix that runs the setup stage in fresh namespaces."""
    import json

    unshare = shutil.which("unshare")
    if unshare is None:
        raise SandboxError("util-linux `unshare` is not installed")
    # With a uid, the id maps are written from outside (map_ids) and the setup stage waits for
    # them; without, the worker is not root and its own uid becomes root inside.
    mapping = [] if uid is not None else ["--map-root-user"]
    return [unshare, "--user", *mapping, "--mount", "--pid", "--fork",
            "--kill-child", "--net", "--propagation", "private",
            sys.executable, "-m", "specgen.eval.namespaces", json.dumps(asdict(spec)), "--"]


def namespaces_possible() -> SandboxStatus:
    """A quick look (a millisecond-scale `unshare` of the same namespaces, no Python started)
    at whether this host lets a process make the sandbox's namespaces at all. The worker's own
    check is a real runner started in a real sandbox (eval/runner_process.py, `probe`)."""
    import subprocess

    unshare = shutil.which("unshare")
    if unshare is None:
        return SandboxStatus(NONE, "util-linux `unshare` is not installed")
    mapping = [] if os.geteuid() == 0 else ["--map-root-user"]
    try:
        done = subprocess.run([unshare, "--user", *mapping, "--mount", "--pid", "--fork", "--net",
                               "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return SandboxStatus(NONE, f"namespaces could not be created: {exc}")
    if done.returncode != 0:
        return SandboxStatus(NONE, "namespaces could not be created: "
                             + (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1])
    return SandboxStatus(NAMESPACES, "user, mount, PID and network namespaces can be made")


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
