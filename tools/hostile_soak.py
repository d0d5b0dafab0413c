"""One worker judges N hostile candidates in a row (every attack class, shuffled), then an honest
one, and its descriptors, memory and disk are back within 1% of where they started.

    python tools/hostile_soak.py --count 100 --stage validate --out /tmp/soak.json
    python tools/hostile_soak.py --only nan_output --count 3      # a subset, for bisecting

Candidates: every CPU-runnable file (`# device:` absent, `cpu` or `any`, stem not ending in `_cuda`)
of tests/eval/redteam/ and tests/eval/corpus/cheat/ whose `# expect:` is neither `correct` nor
`honest-speed ...` (those say the file's work is honest), shuffled with --seed, pass after pass,
up to --count; then one honest candidate (--honest, default the bundled softmax_torch.py).

One `EvalWorker("cpu", ...)`, started once, judges them all at --stage. Before the baseline it
judges each hostile file that builds a `load_inline` extension once (a build is cached per source
and a precompiled header per flag set, about 750 MB made in the background: caches bounded by the
distinct files, not by N; --cold-caches counts them as growth instead), or every hostile file
once with --warm-pass, waits for background builds, then judges the honest candidate. Then, and
after the final honest verdict, it waits for the worker to settle (the spare it starts after each
candidate ready, the killed trees reaped) and measures:

* the worker process's open descriptors and RSS (the judge lives in this process; the disk walks
  run in a child, so that their garbage does not read as the worker's);
* live processes descended from this one (template, runners, builds, anything they left);
* memfds and their bytes held by that tree (runner logs, the arena);
* the host's Shmem (/proc/meminfo: memfds and tmpfs pages, every user's);
* bytes under the worker's work_dir and under /tmp (every user's: --tmp-exclude leaves other
  sessions' entries out of the figure that decides: by default pytest-of-*, nvcc's tmpxft_*
  and tools/build_bench.py's specgen-build-bench-*, none of which a CPU worker writes).

A resource passes when it grew by at most 1% of where it started (a count: max(1, 1%); bytes:
max(one 4 KiB page, 1%)). What grew is attributed: new processes, work_dir paths and /tmp entries
that changed most, the RSS after each verdict (a leak per candidate keeps rising in the second
half, a first use does not), and with --tracemalloc the Python lines whose memory grew.

A hostile candidate accepted at --stage validate (which makes no timed call, so a hack acting only
on timed calls is rightly accepted there) is judged again in full after the measurements and
counts only if accepted there too. Exit status 1 when a hostile candidate was accepted as correct,
the final honest candidate was not, or a resource grew past its allowance.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import fnmatch
import gc
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

HOSTILE_DIRS = (REPO / "tests" / "eval" / "redteam", REPO / "tests" / "eval" / "corpus" / "cheat")
DEFAULT_HONEST = REPO / "specgen" / "data" / "problems" / "candidates" / "softmax_torch.py"
# /tmp entries of other sessions sharing the machine that a CPU worker never writes: pytest's
# folders, nvcc's temporaries, tools/build_bench.py's scratch.
OTHERS_TMP = ["pytest-of-*", "tmpxft_*", "specgen-build-bench-*"]


# ------------------------------------------------------------------------------ the machine

def machine() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    # The tree is often edited beside the commit: how many paths differ says how far HEAD
    # describes the code that ran.
    changed = git("status", "--porcelain", "--untracked-files=no")
    return {
        "cpu_model": model or platform.processor(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "loadavg": os.getloadavg(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git("rev-parse", "HEAD"),
        "git_changed_paths": len(changed.splitlines()) if changed else 0,
    }


# ------------------------------------------------------------------------------ candidates

def runs_on_cpu(path: Path) -> bool:
    from tests.eval.expectations import header
    return header(path, "device") in (None, "cpu", "any") and not path.stem.endswith("_cuda")


def hostile_files() -> list[Path]:
    from tests.eval.expectations import header
    files = []
    for folder in HOSTILE_DIRS:
        for path in sorted(folder.glob("*.py")):
            expect = header(path, "expect") or "reject"
            if runs_on_cpu(path) and expect != "correct" and not expect.startswith("honest-speed"):
                files.append(path)
    return files


def schedule(files: list[Path], count: int, seed: int) -> list[Path]:
    """`count` candidates: whole shuffled passes over `files` (each pass its own order), so every
    attack class comes back before any comes a third time."""
    rng = random.Random(seed)
    out: list[Path] = []
    while files and len(out) < count:
        one_pass = list(files)
        rng.shuffle(one_pass)
        out.extend(one_pass)
    return out[:count]


def label(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


# ------------------------------------------------------------------------------ resources

def _ppids() -> dict[int, int]:
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields start after the last ')'.
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] == "Z":
            continue          # a zombie holds nothing but its pid; it is not a live process
        out[int(name)] = int(fields[1])
    return out


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid, ppid in _ppids().items():
        children[ppid].append(pid)
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def memfd_bytes(pids: list[int]) -> tuple[int, int]:
    """(distinct memfds open in `pids`, their bytes): each counted once however many hold it."""
    seen: dict[tuple[int, int], int] = {}
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue          # another user's runner (a root worker's), or gone
        for fd in names:
            try:
                if not os.readlink(f"{fd_dir}/{fd}").startswith("/memfd:"):
                    continue
                st = os.stat(f"{fd_dir}/{fd}")
            except OSError:
                continue
            seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return len(seen), sum(seen.values())


def process_info(pid: int) -> dict:
    def read(name: str) -> str:
        try:
            return Path(f"/proc/{pid}/{name}").read_bytes().replace(b"\0", b" ").decode(
                errors="replace").strip()
        except OSError:
            return ""
    stat = read("stat")
    fields = stat[stat.rindex(")") + 2:].split() if ")" in stat else []
    return {"pid": pid, "ppid": int(fields[1]) if fields else None,
            "state": fields[0] if fields else "?", "comm": read("comm"),
            "cmdline": read("cmdline")[:160], "uid": _uid(pid)}


def _uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def breakdown(root: Path, depth: int = 3) -> dict[str, int]:
    """Bytes per path of `root` down to `depth` levels, to say where growth lies."""
    out: dict[str, int] = {}
    base = len(root.parts)
    for folder, dirs, files in os.walk(root, onerror=lambda _exc: None):
        rel = Path(folder).parts[base:]
        for name in files + dirs:
            try:
                size = os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
            parts = (*rel, name)
            for n in range(1, min(depth, len(parts)) + 1):
                key = "/".join(parts[:n])
                out[key] = out.get(key, 0) + size
    return out


def tree_bytes(root: Path) -> int:
    """Allocated bytes of the files under `root`, hard links once; unreadable parts skipped."""
    total, seen = 0, set()
    for folder, dirs, files in os.walk(root, onerror=lambda _exc: None):
        for name in files + dirs:
            try:
                st = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def tmp_entries() -> dict[str, int]:
    """Bytes per top-level entry of /tmp, for saying which one grew."""
    out = {}
    try:
        names = os.listdir("/tmp")
    except OSError:
        return out
    for name in names:
        path = Path("/tmp") / name
        try:
            st = path.lstat()
        except OSError:
            continue
        out[name] = tree_bytes(path) + st.st_blocks * 512 if path.is_dir() and not \
            path.is_symlink() else st.st_blocks * 512
    return out


def _kib_field(path: str, key: str) -> int:
    for line in Path(path).read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def walks(work_dir: Path) -> dict:
    return {"work_dir_bytes": tree_bytes(work_dir), "tmp_entries": tmp_entries(),
            "work_dir": breakdown(work_dir)}


def measure(work_dir: Path, tmp_exclude: tuple[str, ...] = ()) -> dict:
    gc.collect()
    # This process's own readings first, before the walk's child exists.
    fds = len(os.listdir("/proc/self/fd"))
    rss = _kib_field("/proc/self/status", "VmRSS")
    tree = descendants(os.getpid())
    memfds, memfd_total = memfd_bytes([os.getpid(), *tree])
    children = [process_info(pid) for pid in tree]
    shmem = _kib_field("/proc/meminfo", "Shmem")
    # The walks of /tmp (other users' test sessions: hundreds of thousands of paths) run in a
    # child: done here, their garbage stays in this process's heap and reads as the worker's RSS.
    done = subprocess.run([sys.executable, __file__, "--walk", str(work_dir)],
                          capture_output=True, text=True, check=True)
    walked = json.loads(done.stdout)
    entries = walked["tmp_entries"]
    return {
        "fds": fds,
        "rss_bytes": rss,
        "children": len(tree),
        "tree_memfds": memfds,
        "tree_memfd_bytes": memfd_total,
        "host_shmem_bytes": shmem,
        "work_dir_bytes": walked["work_dir_bytes"],
        "tmp_kept_bytes": sum(n for name, n in entries.items()
                              if not any(fnmatch.fnmatch(name, g) for g in tmp_exclude)),
        "tmp_bytes": sum(entries.values()),
        "_tmp_entries": entries,
        "_child_pids": tree,
        "_children": children,
        "_work_dir": walked["work_dir"],
    }


def background_builds() -> list[int]:
    """Precompiled-header makers (`python -m specgen.eval.pch`) this process's workers started:
    they run in the background, minutes each, and write hundreds of MB into the cache."""
    found = []
    for pid in descendants(os.getpid()):
        try:
            if b"specgen.eval.pch" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


def wait_for_background_builds(timeout_s: float) -> float:
    began = time.monotonic()
    while background_builds() and time.monotonic() - began < timeout_s:
        time.sleep(2.0)
    return time.monotonic() - began


def settle(worker, work_dir: Path, tmp_exclude: tuple[str, ...],
           timeout_s: float = 60.0) -> dict:
    """A measurement once the worker is quiet: its spare runner ready (it is started while the
    last verdict is written) and the killed trees gone. Two equal readings of the counts a second
    apart, or the last reading at the timeout."""
    pool = getattr(worker, "_pool", None)
    for _runner, thread in list(getattr(pool, "_spares", ()) or ()):
        thread.join(timeout_s)
    deadline = time.monotonic() + timeout_s
    last = measure(work_dir, tmp_exclude)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = measure(work_dir, tmp_exclude)
        if all(now[k] == last[k] for k in ("fds", "children", "tree_memfds")):
            return now
        last = now
    return last


ROWS = (
    # key, what, whether it is a count (allowance at least 1), whether it decides the result
    ("fds", "worker open descriptors", True, True),
    ("rss_bytes", "worker RSS", False, True),
    ("children", "live descendant processes", True, True),
    ("tree_memfds", "memfds held by the tree", True, True),
    ("tree_memfd_bytes", "memfd bytes held by the tree", False, True),
    ("host_shmem_bytes", "host Shmem (all users)", False, True),
    ("work_dir_bytes", "bytes under work_dir", False, True),
    ("tmp_kept_bytes", "bytes under /tmp (less excluded)", False, True),
    # Other sessions on a shared machine write gigabytes under /tmp while this runs (test
    # sessions, nvcc's temporaries): the whole of /tmp is shown, the figure without those
    # entries decides.
    ("tmp_bytes", "bytes under /tmp (all, info)", False, False),
)


def compare(before: dict, after: dict) -> list[dict]:
    rows = []
    for key, what, is_count, gated in ROWS:
        b, a = before[key], after[key]
        delta = a - b
        # A count may always move by one; bytes by one page (memfds and files are allocated in
        # 4 KiB blocks: under 400 KiB, 1% is finer than anything can change by).
        allowance = max(1, 0.01 * b) if is_count else max(4096, 0.01 * b)
        rows.append({"key": key, "what": what, "before": b, "after": a, "delta": delta,
                     "pct": (100.0 * delta / b) if b else (0.0 if delta == 0 else float("inf")),
                     "allowance": allowance, "within": delta <= allowance, "gated": gated})
    return rows


def _size(value: float, key: str) -> str:
    if key.endswith("bytes"):
        sign = "-" if value < 0 else ""
        value = abs(value)
        for unit in ("B", "KiB", "MiB", "GiB"):
            if value < 1024 or unit == "GiB":
                return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.2f} {unit}"
            value /= 1024
    return f"{value:g}"


def resource_table(rows: list[dict]) -> str:
    lines = [f"{'resource':<32} {'before':>12} {'after':>12} {'delta':>12} {'%':>8}  within 1%",
             "-" * 90]
    for r in rows:
        pct = "inf" if r["pct"] == float("inf") else f"{r['pct']:+.2f}"
        within = "yes" if r["within"] else "NO"
        if not r["gated"]:
            within = f"({within.lower()}, not counted)"
        lines.append(f"{r['what']:<32} {_size(r['before'], r['key']):>12} "
                     f"{_size(r['after'], r['key']):>12} {_size(r['delta'], r['key']):>12} "
                     f"{pct:>8}  {within}")
    return "\n".join(lines)


def tmp_growth(before: dict, after: dict, top: int = 5) -> list[tuple[str, int]]:
    b, a = before["_tmp_entries"], after["_tmp_entries"]
    grown = [(name, a.get(name, 0) - b.get(name, 0)) for name in set(a) | set(b)]
    grown = [g for g in grown if g[1]]
    grown.sort(key=lambda g: -abs(g[1]))
    return grown[:top]


# ------------------------------------------------------------------------------ judging

def judged(worker, path: Path, stage: str, index: int, role: str) -> dict:
    from tests.eval.conftest import candidate_submission
    from tests.eval.expectations import header, meets
    expect = "correct" if role == "honest" else (header(path, "expect") or "reject")
    began = time.monotonic()
    verdict = worker.run(candidate_submission(path), stage)
    seconds = time.monotonic() - began
    ok, why = meets(verdict, expect)
    # Unsettled readings right after the verdict (a spare may be starting): for the trajectory
    # of a slow leak, not for the before/after figures.
    return {"index": index, "role": role, "file": label(path), "expect": expect,
            "correct": verdict.correct, "code": verdict.code, "error": verdict.error,
            "flags": list(verdict.flags), "sandbox": verdict.sandbox, "seconds": seconds,
            "as_expected": ok, "why": why,
            "rss_after": _kib_field("/proc/self/status", "VmRSS"),
            "fds_after": len(os.listdir("/proc/self/fd"))}


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def verdict_line(v: dict) -> str:
    error = (v["error"] or "").replace("\n", " ")[:100]
    return (f"{v['index']:>4} {v['role'][:7]:<7} {v['file']:<52} {str(v['correct']):<5} "
            f"{v['code'] or '-':<16} {v['seconds']:6.1f}s  flags={v['flags']} error={error!r}")


# ------------------------------------------------------------------------------ main

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=100, help="hostile candidates (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    parser.add_argument("--stage", choices=("full", "validate"), default="full",
                        help="validate: no timing, a few times faster")
    parser.add_argument("--sandbox", choices=("required", "optional"), default="required",
                        help="optional: run unsandboxed where namespaces cannot be made")
    parser.add_argument("--honest", type=Path, default=DEFAULT_HONEST,
                        help="the honest candidate judged just before the baseline and last")
    parser.add_argument("--only", action="append", default=[],
                        help="hostile files whose name contains this (repeatable): for bisecting")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="the worker's work_dir (default: a fresh folder under /tmp, removed "
                             "afterwards unless --keep-work-dir)")
    parser.add_argument("--keep-work-dir", action="store_true")
    parser.add_argument("--cold-caches", action="store_true",
                        help="no warm-up verdict of the files that build extensions: their "
                             "build cache and precompiled headers then count as growth")
    parser.add_argument("--warm-pass", action="store_true",
                        help="judge every hostile file once before the baseline (the growth "
                             "measured is then per repetition, not first use)")
    parser.add_argument("--build-wait-s", type=float, default=900.0,
                        help="longest wait for background precompiled-header builds before "
                             "each measurement (default 900)")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="trace the worker process's Python allocations between the two "
                             "measurements and print the lines whose memory grew most (its own "
                             "bookkeeping then counts in the RSS row)")
    parser.add_argument("--tmp-exclude", action="append", default=None, metavar="GLOB",
                        help="top-level /tmp entries left out of the deciding /tmp figure "
                             "(repeatable; default: " + " ".join(OTHERS_TMP) + ", other "
                             "sessions' test runs and compilers; an empty GLOB keeps all)")
    parser.add_argument("--out", type=Path, default=None, help="JSON of everything")
    args = parser.parse_args(argv)

    from specgen.eval import EvalOptions, EvalWorker

    tmp_exclude = tuple(g for g in (args.tmp_exclude if args.tmp_exclude is not None
                                    else OTHERS_TMP) if g)

    info = machine()
    files = hostile_files()
    if args.only:
        files = [f for f in files if any(s in f.name for s in args.only)]
    if not files:
        print("no hostile candidate matches", file=sys.stderr)
        return 2
    plan = schedule(files, args.count, args.seed)
    work_dir = (args.work_dir or Path(tempfile.mkdtemp(prefix="hostile-soak-"))).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)

    print(f"machine: {info['cpu_model']}, {info['cores']} cores ({info['cores_usable']} usable), "
          f"load {' '.join(f'{x:.2f}' for x in info['loadavg'])}, kernel {info['kernel']}, "
          f"Python {info['python']}")
    print(f"date: {info['date']}  git: {info['git_commit']} "
          f"(+{info['git_changed_paths']} tracked paths changed in the tree)")
    print(f"stage {args.stage}, sandbox {args.sandbox}, seed {args.seed}: {len(plan)} hostile "
          f"candidates from {len(files)} files, then {label(args.honest)}; work_dir {work_dir}; "
          f"/tmp figure excludes {', '.join(tmp_exclude) or 'nothing'}")
    sys.stdout.flush()

    # The tests' settings: timings only need to exist on the CPU.
    options = EvalOptions(timing_trials=8, warmup=1, timeout_s=120.0, sandbox=args.sandbox)
    worker = EvalWorker("cpu", work_dir, options=options)
    began = time.monotonic()
    worker.start()
    print(f"sandbox: {worker.sandbox_status.kind} ({worker.sandbox_status.detail})")
    verdicts: list[dict] = []
    warm_hostile: list[dict] = []
    try:
        if args.warm_pass:
            # Every file once before the baseline: what remains is growth per repetition, with
            # each code path's first use (lazy imports, per-problem caches) left out.
            for path in files:
                warm_hostile.append(judged(worker, path, args.stage, 0, "warm-up"))
                print(verdict_line(warm_hostile[-1]))
        elif not args.cold_caches:
            # A file with a load_inline extension is built once per source (a failed build
            # too, as a FAILED marker) and its compiler flags get a precompiled header (hundreds
            # of MB, made in the background): caches bounded by the distinct files, not by N.
            # One verdict of each such file before the baseline keeps them out of the growth.
            from specgen.eval.loader import candidate_from_text
            for path in files:
                try:
                    builds = candidate_from_text(path.read_text()).needs_build
                except Exception:  # noqa: BLE001 - a file the loader refuses builds nothing
                    builds = False
                if builds:
                    warm_hostile.append(judged(worker, path, args.stage, 0, "warm-up"))
                    print(verdict_line(warm_hostile[-1]))
        waited = wait_for_background_builds(args.build_wait_s)
        if waited > 1:
            print(f"waited {waited:.0f} s for background precompiled-header builds")
        # The honest verdict last before the baseline, as after the final one: the same
        # problem's reference runner and arena are alive at both measurements.
        warm = judged(worker, args.honest, args.stage, 0, "honest")
        print(verdict_line(warm))
        if args.tracemalloc:
            import tracemalloc
            tracemalloc.start(8)
        before = settle(worker, work_dir, tmp_exclude)
        snap_before = tracemalloc.take_snapshot() if args.tracemalloc else None
        for index, path in enumerate(plan, 1):
            verdicts.append(judged(worker, path, args.stage, index, "hostile"))
            print(verdict_line(verdicts[-1]))
            sys.stdout.flush()
        final = judged(worker, args.honest, args.stage, len(plan) + 1, "honest")
        print(verdict_line(final))
        waited = wait_for_background_builds(args.build_wait_s)
        if waited > 1:
            print(f"waited {waited:.0f} s for background precompiled-header builds")
        after = settle(worker, work_dir, tmp_exclude)
        snap_after = tracemalloc.take_snapshot() if args.tracemalloc else None
        # --stage validate makes no timed call, so a hack that acts only on timed calls (right
        # for the checked calls, cheap once timed) is rightly accepted there. Each file accepted
        # is judged again in full, after the measurements, and counts only if accepted there.
        confirmed: dict[str, dict] = {}
        if args.stage != "full":
            for v in (*warm_hostile, *verdicts):
                if v["correct"] and v["file"] not in confirmed:
                    confirmed[v["file"]] = judged(worker, REPO / v["file"], "full", v["index"],
                                                  "confirm")
                    print(verdict_line(confirmed[v["file"]]) + "  (judged again in full)")
    finally:
        worker.close()
    wall = time.monotonic() - began

    rows = compare(before, after)
    accepted_here = [v for v in (*warm_hostile, *verdicts) if v["correct"]]
    accepted = [v for v in accepted_here
                if args.stage == "full" or confirmed[v["file"]]["correct"]]
    codes = collections.Counter(v["code"] or "(judged)" for v in verdicts)
    seconds = [v["seconds"] for v in verdicts]
    leaked = [r for r in rows if r["gated"] and not r["within"]]
    honest_ok = final["correct"] and not final["flags"] and final["error"] is None
    per_file: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for v in verdicts:
        per_file[v["file"]]["correct" if v["correct"] else (v["code"] or "rejected")] += 1

    print()
    print(f"== resources (before: after warm-up honest verdict; after: after final honest "
          f"verdict; pid {os.getpid()}) ==")
    print(resource_table(rows))
    growth = tmp_growth(before, after)
    if growth:
        print("/tmp entries that changed most: "
              + ", ".join(f"{name} {_size(d, 'bytes')}"
                          + (" (excluded)" if any(fnmatch.fnmatch(name, g) for g in tmp_exclude)
                             else "") for name, d in growth))
    grown = sorted(((k, after["_work_dir"].get(k, 0) - before["_work_dir"].get(k, 0))
                    for k in set(after["_work_dir"]) | set(before["_work_dir"])),
                   key=lambda kv: (-abs(kv[1]), kv[0]))
    grown = [kv for kv in grown if kv[1]][:8]
    if grown:
        print("work_dir paths that changed most: "
              + ", ".join(f"{k} {_size(d, 'bytes')}" for k, d in grown))
    trajectory = [v["rss_after"] for v in verdicts]
    slope = None
    if len(trajectory) >= 8:
        # Growth per verdict over the second half: a one-time growth (a code path's first use,
        # an allocator's arena) is over by then, a leak per candidate is not.
        half = trajectory[len(trajectory) // 2:]
        xs = range(len(half))
        mx, my = statistics.fmean(xs), statistics.fmean(half)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, half)) / \
            sum((x - mx) ** 2 for x in xs)
        marks = sorted({0, len(trajectory) // 4, len(trajectory) // 2,
                        3 * len(trajectory) // 4, len(trajectory) - 1})
        print("worker RSS after verdict: "
              + ", ".join(f"#{verdicts[i]['index']} {_size(trajectory[i], 'bytes')}"
                          for i in marks)
              + f"; second half {slope / 1024:+.1f} KiB per verdict")
    top_growth: list[str] = []
    if snap_before is not None and snap_after is not None:
        import tracemalloc
        stats = snap_after.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)]) \
            .compare_to(snap_before.filter_traces([tracemalloc.Filter(False,
                                                                        tracemalloc.__file__)]),
                        "traceback")
        for stat in [st for st in stats if st.size_diff > 0][:12]:
            # The allocating line, and the project's line that led there (who keeps it).
            frames = list(stat.traceback)
            ours = next((f for f in reversed(frames) if "/specgen/" in f.filename
                         and f is not frames[-1]), None)
            where = f"{frames[-1].filename}:{frames[-1].lineno}"
            if ours is not None:
                where += f" <- {ours.filename}:{ours.lineno}"
            top_growth.append(f"{_size(stat.size_diff, 'bytes'):>10} {stat.count_diff:+6d} "
                              f"blocks  {where}")
        print("Python allocations grown most between the measurements (tracemalloc):")
        print("\n".join("  " + line for line in top_growth))
    before_pids = {c["pid"] for c in before["_children"]}
    after_pids = {c["pid"] for c in after["_children"]}
    for c in after["_children"]:
        if c["pid"] not in before_pids:
            print(f"new process: pid {c['pid']} ppid {c['ppid']} uid {c['uid']} state "
                  f"{c['state']} {c['comm']}: {c['cmdline']}")
    gone = [c for c in before["_children"] if c["pid"] not in after_pids]
    if gone:
        print("processes gone since before (replaced): "
              + ", ".join(f"{c['pid']} {c['comm']}" for c in gone))
    print()
    print("== totals ==")
    print(f"hostile candidates judged: {len(verdicts)} ({len(files)} distinct files), "
          f"wall {wall:.0f} s")
    if args.stage != "full":
        print(f"hostile accepted at {args.stage}: {len(accepted_here)}"
              + "".join(f"\n  #{v['index']} {v['file']} (expect {v['expect']}): in full "
                        + ("ACCEPTED too" if confirmed[v["file"]]["correct"] else
                           f"rejected: {(confirmed[v['file']]['error'] or '')[:100]!r} "
                           f"{confirmed[v['file']]['flags']}")
                        for v in accepted_here))
    print(f"hostile accepted as correct: {len(accepted)}"
          + "".join(f"\n  ACCEPTED #{v['index']} {v['file']} (expect {v['expect']})"
                    for v in accepted))
    print("verdict codes: " + ", ".join(f"{c}={n}" for c, n in codes.most_common()))
    unmet = [v for v in verdicts if not v["as_expected"]]
    why_note = (" (information; --stage validate makes no timed call, so expectations met only "
                "by timing cannot show)" if args.stage != "full" else " (information)")
    print(f"verdicts not matching their # expect: header{why_note}: {len(unmet)}"
          + "".join(f"\n  #{v['index']} {v['file']}: {v['why']}" for v in unmet[:20]))
    print(f"seconds per hostile verdict: p50 {quantile(seconds, 0.5):.2f}, "
          f"p95 {quantile(seconds, 0.95):.2f}, max {max(seconds):.2f}, "
          f"mean {statistics.fmean(seconds):.2f}")
    print(f"final honest verdict correct: {honest_ok} ({final['file']}, code "
          f"{final['code'] or '-'}, error {final['error']!r}, flags {final['flags']})")
    print(f"resources beyond 1%: {', '.join(r['what'] for r in leaked) or 'none'}")
    failed = bool(accepted) or not honest_ok or bool(leaked)
    print(f"RESULT: {'FAIL' if failed else 'PASS'}")

    if args.out is not None:
        strip = lambda m: {k: v for k, v in m.items() if not k.startswith("_")}  # noqa: E731
        report = {
            "machine": info, "args": {k: str(v) if isinstance(v, Path) else v
                                      for k, v in vars(args).items()},
            "work_dir": str(work_dir), "sandbox": {"kind": worker.sandbox_status.kind,
                                                   "detail": worker.sandbox_status.detail},
            "hostile_files": [label(f) for f in files], "plan": [label(p) for p in plan],
            "warmup": warm, "verdicts": verdicts, "final": final,
            "confirmed_in_full": confirmed, "warm_hostile": warm_hostile,
            "rss_trajectory": trajectory, "rss_slope_bytes_per_verdict": slope,
            "tracemalloc_top": top_growth,
            "children_before": before["_children"], "children_after": after["_children"],
            "work_dir_growth": grown,
            "before": strip(before), "after": strip(after),
            "tmp_growth": growth, "resources": rows,
            "totals": {"accepted": [v["file"] for v in accepted], "codes": dict(codes),
                       "p50_s": quantile(seconds, 0.5), "p95_s": quantile(seconds, 0.95),
                       "wall_s": wall, "honest_correct": honest_ok,
                       "beyond_1pct": [r["key"] for r in leaked],
                       "per_file": {f: dict(c) for f, c in per_file.items()}},
            "result": "fail" if failed else "pass",
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {args.out}")
    if args.work_dir is None and not args.keep_work_dir:
        shutil.rmtree(work_dir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--walk"]:
        print(json.dumps(walks(Path(sys.argv[2]))))
        sys.exit(0)
    sys.exit(main())
