"""Hostile candidates against the sandbox: each checks its verdict, that its side effect did not
happen outside the run, and that the worker still serves an honest candidate afterwards.

The payloads are hidden (hex-encoded `exec`), as an attacker would hide them: these tests are
about what the sandbox stops once the code runs.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from specgen.eval import EvalOptions, EvalWorker, runner_process, sandbox
from specgen.eval.redact import MAX_ERROR_CHARS, redact, register_secret
from tests.eval.conftest import BUNDLED, submission

HONEST_SOFTMAX = (BUNDLED / "candidates" / "softmax_torch.py").read_text()
SECRET = "s3cret-" + uuid.uuid4().hex
HIDDEN = Path("/var/tmp") / f"specgen-test-keys-{uuid.uuid4().hex[:8]}"

_POSSIBLE = sandbox.namespaces_possible()
needs_namespaces = pytest.mark.skipif(_POSSIBLE.kind != sandbox.NAMESPACES,
                                      reason=f"no sandbox on this host: {_POSSIBLE.detail}")
pytestmark = needs_namespaces


def hostile(payload: str) -> str:
    """A candidate that runs `payload` at import, then behaves honestly."""
    return (f"exec(bytes.fromhex({payload.encode().hex()!r}).decode())\n" + HONEST_SOFTMAX)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> EvalWorker:
    os.environ["SPECGEN_TEST_SECRET"] = SECRET          # a setting the runner must never see
    HIDDEN.mkdir(parents=True, exist_ok=True)
    (HIDDEN / "node.key").write_text(SECRET)
    options = EvalOptions(timeout_s=60.0, timing_trials=4, warmup=1, overhead_trials=5,
                          scratch_mb=64, build_scratch_mb=64, memory_limit_mb=1024,
                          max_processes=256)
    worker = EvalWorker("cpu", tmp_path_factory.mktemp("sandboxed"), spare_processes=1,
                        options=options, hidden_paths=[HIDDEN])
    worker.start()
    yield worker
    worker.close()
    os.environ.pop("SPECGEN_TEST_SECRET", None)
    for path in HIDDEN.iterdir():
        path.unlink()
    HIDDEN.rmdir()


def still_serves(worker: EvalWorker) -> None:
    verdict = worker.run(submission("softmax", HONEST_SOFTMAX), "validate")
    assert verdict.correct and verdict.sandbox == "namespaces", verdict


def processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                pass
    return found


def test_honest_candidate_runs_sandboxed(worker: EvalWorker) -> None:
    verdict = worker.run(submission("softmax", HONEST_SOFTMAX), "full")
    assert verdict.correct and verdict.speedup is not None, verdict
    assert verdict.sandbox == "namespaces"
    assert worker.sandbox_status.kind == "namespaces"


def test_writes_outside_its_run_do_not_happen(worker: EvalWorker, tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)        # writable by anyone: only the sandbox can stop this write
    marker = f"pwned-{uuid.uuid4().hex[:8]}"
    targets = [f"/tmp/{marker}", str(open_dir / marker), str(Path.cwd() / marker),
               f"/var/tmp/{marker}", str(worker.work_dir / marker)]
    payload = "import os\n" + "".join(
        f"os.system('echo x > {t} 2>/dev/null')\n" for t in targets)
    verdict = worker.run(submission("softmax", hostile(payload)), "validate")
    assert verdict.correct, verdict      # the writes failed or stayed private; the kernel is fine
    for target in targets:
        assert not os.path.exists(target), target
    still_serves(worker)


def test_an_escaped_grandchild_dies_with_the_run(worker: EvalWorker) -> None:
    marker = f"grandchild-{uuid.uuid4().hex[:8]}"
    payload = ("import os\n"
               "if os.fork() == 0:\n"
               "    os.setsid()\n"
               "    if os.fork() == 0:\n"
               f"        os.execv('/bin/sleep', ['sleep', '600', '{marker}'])\n"
               "    os._exit(0)\n"
               "os.wait()\n")
    verdict = worker.run(submission("softmax", hostile(payload)), "validate")
    assert verdict.correct, verdict
    deadline = time.monotonic() + 10
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with(marker) == []
    still_serves(worker)


def test_the_environment_and_hidden_files_do_not_leak(worker: EvalWorker) -> None:
    payload = ("import os, glob\n"
               # what the test looks for first: the error text is capped, and a host's
               # allowed variables (NVIDIA_REQUIRE_CUDA...) can be long
               f"seen = {{'key': os.path.exists('{HIDDEN / 'node.key'}')}}\n"
               "seen.update(os.environ)\n"
               "for path in glob.glob('/proc/*/environ'):\n"
               "    try:\n"
               "        seen[path] = open(path, 'rb').read().decode('latin-1')\n"
               "    except OSError as exc:\n"
               "        seen[path] = repr(exc)\n"
               "seen['pids'] = sorted(os.listdir('/proc'))[:50]\n"
               "raise RuntimeError(repr(seen) * 50)\n")
    verdict = worker.run(submission("softmax", hostile(payload)), "validate")
    assert not verdict.correct and verdict.error is not None
    assert "RuntimeError" in verdict.error
    assert SECRET not in verdict.error and "SPECGEN_TEST_SECRET" not in verdict.error
    assert "'key': False" in verdict.error                 # the key's folder is not there
    assert len(verdict.error) <= MAX_ERROR_CHARS
    still_serves(worker)


def test_proc_shows_only_the_runs_own_processes(worker: EvalWorker) -> None:
    # The sandbox mounts its own /proc: the worker, the node and other runs are not in it.
    payload = ("import os\n"
               "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
               "try:\n"
               "    open('/proc/sys/vm/drop_caches', 'w').write('3')\n"
               "    sysctl = 'written'\n"
               "except OSError as exc:\n"
               "    sysctl = exc.strerror\n"
               "raise RuntimeError(f'pids={pids} sysctl={sysctl}')\n")
    verdict = worker.run(submission("softmax", hostile(payload)), "validate")
    assert verdict.error is not None and "pids=[" in verdict.error
    pids = verdict.error.split("pids=[", 1)[1].split("]", 1)[0]
    seen = [int(p) for p in pids.split(",")]
    assert seen[0] == 1 and len(seen) <= 4 and max(seen) < 64      # init, the runner, its own
    assert "sysctl=Read-only file system" in verdict.error           # /proc/sys stays read-only
    still_serves(worker)


class _Listener:
    """A TCP and a Unix socket standing in for the scheduler's and a node's; counts connections."""

    def __init__(self, folder: Path) -> None:
        self.accepted = 0
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.port = self.tcp.getsockname()[1]
        self.path = str(folder / "node.sock")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.path)
        os.chmod(self.path, 0o777)
        self.unix.listen()
        for sock in (self.tcp, self.unix):
            sock.settimeout(0.2)
            threading.Thread(target=self._accept, args=(sock,), daemon=True).start()
        self.stop = False

    def _accept(self, sock: socket.socket) -> None:
        while not getattr(self, "stop", False):
            try:
                conn, _ = sock.accept()
            except (socket.timeout, OSError):
                continue
            self.accepted += 1
            conn.close()


def test_no_connection_to_the_scheduler_or_node_sockets(worker: EvalWorker, tmp_path: Path) -> None:
    listener = _Listener(tmp_path)
    payload = ("import socket\n"
               "results = []\n"
               "s = socket.socket(); s.settimeout(2)\n"
               f"results.append(('tcp', s.connect_ex(('127.0.0.1', {listener.port}))))\n"
               "u = socket.socket(socket.AF_UNIX); u.settimeout(2)\n"
               f"results.append(('unix', u.connect_ex({listener.path!r})))\n"
               "raise RuntimeError('connect results %r' % results)\n")
    try:
        verdict = worker.run(submission("softmax", hostile(payload)), "validate")
    finally:
        listener.stop = True
    assert "connect results" in (verdict.error or ""), verdict
    assert "('tcp', 0)" not in verdict.error and "('unix', 0)" not in verdict.error
    assert listener.accepted == 0
    still_serves(worker)


def test_a_fork_bomb_is_contained(worker: EvalWorker) -> None:
    marker = f"bomb-{uuid.uuid4().hex[:8]}"
    payload = ("import os, time\n"
               "children = 0\n"
               "while children < 100000:\n"
               "    pid = os.fork()\n"
               "    if pid == 0:\n"
               f"        os.execv('/bin/sleep', ['sleep', '600', '{marker}'])\n"
               "    children += 1\n")
    began = time.monotonic()
    verdict = worker.run(submission("softmax", hostile(payload)), "validate")
    assert not verdict.correct and "BlockingIOError" in (verdict.error or ""), verdict
    assert time.monotonic() - began < 60
    deadline = time.monotonic() + 10
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with(marker) == []
    still_serves(worker)


def test_filling_its_temp_dir_stays_inside(worker: EvalWorker) -> None:
    payload = ("import os\n"
               "os.system('dd if=/dev/zero of=/tmp/fill bs=1M count=4096 2>/dev/null')\n"
               "os.system('dd if=/dev/zero of=$HOME/fill bs=1M count=4096 2>/dev/null')\n"
               "size = os.path.getsize('/tmp/fill')\n"
               "assert size <= 64 * 2**20, size\n")
    verdict = worker.run(submission("softmax", hostile(payload)), "validate")
    assert verdict.correct, verdict       # ENOSPC at 64 MiB (EvalOptions.scratch_mb), then honest
    assert not os.path.exists("/tmp/fill")
    still_serves(worker)


def test_other_runs_and_the_checkout_are_not_in_its_view(worker: EvalWorker) -> None:
    # A run folder beside the checkout, as `specgen optimize` writes one, with its secrets.
    run = Path.cwd() / "specgen-runs" / f"job-{uuid.uuid4().hex[:8]}"
    run.mkdir(parents=True)
    (run / "result.json").write_text(SECRET)
    (run / "journal.jsonl").write_text(SECRET)
    try:
        payload = ("import os\n"
                   f"seen = {{p: os.path.exists(p) for p in ({str(run / 'result.json')!r}, "
                   f"{str(Path.cwd() / 'README.md')!r}, {str(Path.cwd() / 'tests')!r}, "
                   f"{str(worker.work_dir / 'logs')!r})}}\n"
                   f"seen['work'] = sorted(os.listdir({str(worker.work_dir)!r}))\n"
                   f"seen['runs'] = os.path.exists({str(Path.cwd() / 'specgen-runs')!r})\n"
                   "raise RuntimeError('view %r' % seen)\n")
        verdict = worker.run(submission("softmax", hostile(payload)), "validate")
    finally:
        for path in run.iterdir():
            path.unlink()
        run.rmdir()
    assert "view {" in (verdict.error or ""), verdict
    assert "True" not in verdict.error and "'runs': False" in verdict.error, verdict.error
    assert "'work': ['cache']" in verdict.error         # the worker's cache, read-only; no logs
    assert SECRET not in verdict.error
    still_serves(worker)


def test_a_build_writes_only_into_its_capped_folder(worker: EvalWorker) -> None:
    # The build runs the candidate's module: a module that fills the disk fills a 64 MiB tmpfs.
    payload = ("import os\n"
               "os.system('dd if=/dev/zero of=/tmp/fill bs=1M count=4096 2>/dev/null')\n"
               "raise RuntimeError('built %d bytes' % os.path.getsize('/tmp/fill'))\n")
    source = hostile(payload) + "\n# torch.utils.cpp_extension.load_inline is named: a build\n"
    result = worker.build(source)
    assert result.module_error is not None and "built " in result.module_error, result
    written = int(result.module_error.split("built ", 1)[1].split(" bytes")[0])
    assert written <= 64 * 2**20, written          # EvalOptions.build_scratch_mb
    assert not os.path.exists("/tmp/fill")


def test_children_count_against_the_memory_limit(worker: EvalWorker) -> None:
    # Three forked children of 600 MiB each under a 1,024 MiB limit: the tree is over it.
    payload = ("import os, time\n"
               "pids = []\n"
               "for _ in range(3):\n"
               "    pid = os.fork()\n"
               "    if pid == 0:\n"
               "        block = bytearray(600 * 2**20)\n"
               "        for i in range(0, len(block), 4096):\n"
               "            block[i] = 1\n"
               "        time.sleep(30)\n"
               "        os._exit(0)\n"
               "    pids.append(pid)\n"
               "time.sleep(8)\n")
    verdict = worker.run(submission("softmax", hostile(payload)), "validate")
    assert not verdict.correct, verdict
    assert "memory" in (verdict.error or ""), verdict
    still_serves(worker)


def test_threads_and_optional_imports_are_not_refused(worker: EvalWorker) -> None:
    # No static refusals: a thread pool and a guarded optional import run and are judged.
    source = ("import threading\n"
              "try:\n"
              "    import not_installed_module_xyz\n"
              "except ImportError:\n"
              "    not_installed_module_xyz = None\n" + HONEST_SOFTMAX)
    verdict = worker.run(submission("softmax", source), "validate")
    assert verdict.correct and verdict.flags == [], verdict


def test_redact_bounds_and_scrubs() -> None:
    register_secret("registered-secret-value")
    text = redact("a registered-secret-value b " + "x" * 10_000, limit=100)
    assert "registered-secret-value" not in text and "<redacted>" in text
    assert len(text) <= 100 and text.endswith("[cut]")


def test_refused_without_a_sandbox_unless_allowed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(runner_process, "probe",
                        lambda template: sandbox.SandboxStatus(sandbox.NONE, "no unshare"))
    with EvalWorker("cpu", tmp_path / "a", spare_processes=0) as refusing:
        verdict = refusing.run(submission("softmax", HONEST_SOFTMAX), "validate")
        assert not verdict.correct and verdict.sandbox == "none"
        assert "refused: this host cannot sandbox candidates (no unshare)" in verdict.error
    with EvalWorker("cpu", tmp_path / "b", spare_processes=0,
                    options=EvalOptions(sandbox="optional")) as allowing:
        verdict = allowing.run(submission("softmax", HONEST_SOFTMAX), "validate")
        assert verdict.correct and verdict.sandbox == "none", verdict


def test_a_gpu_worker_checks_that_cuda_starts_inside_the_sandbox(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU host the answer is the host's: see tests/eval/test_gpu.py")
    # No driver here: the worker's probe (a real runner) declares the sandbox unusable for GPU
    # candidates, with the reason, and refuses them.
    with EvalWorker("cuda:0", tmp_path / "gpu", spare_processes=0) as gpu_worker:
        assert gpu_worker.sandbox_status.kind == sandbox.NONE
        assert "CUDA does not start inside the sandbox" in gpu_worker.sandbox_status.detail
        assert gpu_worker.refuses_candidates


def test_a_compiler_outside_the_system_folders_is_in_the_view(tmp_path: Path, monkeypatch) -> None:
    # e.g. a host whose gcc lives in /opt/gcc: builds and Triton's launcher need all of it.
    prefix = tmp_path / "toolchain"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "libexec").mkdir()
    compiler = prefix / "bin" / "mycc"
    compiler.write_text("#!/bin/sh\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    assert str(prefix.resolve()) in sandbox.toolchain_prefixes(str(Path.cwd()))
    assert str(prefix.resolve()) in sandbox.view_paths()


LINKED_START = """
import json, sys
from pathlib import Path
from specgen.eval import runner_process, sandbox
from specgen.eval.options import EvalOptions

work = Path(sys.argv[1])
if sys.argv[2] == "no-links":            # the view as it was laid before the links were
    sandbox.view_aliases = lambda *args, **kwargs: []
try:
    template = runner_process.Template("cpu", work, EvalOptions(), True, work / "cache", [])
except runner_process.RunnerError as exc:
    print(json.dumps({"error": str(exc)}))
    sys.exit(0)
status = runner_process.probe(template)
template.close()
print(json.dumps({"kind": status.kind, "detail": status.detail, "prefix": sys.prefix}))
"""


def _start_through(link: Path, work: Path, mode: str) -> dict:
    interpreter = link / Path(sys.executable).relative_to(sys.prefix)
    (work / "cache").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": sandbox.python_path()}
    done = subprocess.run([str(interpreter), "-c", LINKED_START, str(work), mode], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.executable.startswith(sys.prefix + "/"),
                    reason="the interpreter is not inside its prefix")
def test_an_interpreter_reached_through_a_linked_folder_starts_its_sandbox(tmp_path: Path) -> None:
    """A virtual environment reached through a symbolic link (its folder linked elsewhere, as a
    deployment links its current release): the interpreter's own path must exist in the view,
    or the template cannot start and every candidate is refused."""
    outside = Path(tempfile.mkdtemp(prefix="specgen-link-", dir="/var/tmp"))
    try:
        for folder in (tmp_path, outside):       # under the sandbox's /tmp, and elsewhere
            link = folder / "venv-link"
            link.symlink_to(Path(sys.prefix).resolve())
            started = _start_through(link, tmp_path / folder.name, "links")
            assert started.get("kind") == sandbox.NAMESPACES, started
            assert started["prefix"] == str(link)
        # Without the links laid, it cannot start: the error says why, from the sandbox's
        # own stderr, instead of "the other end closed the channel; log: (empty)".
        failed = _start_through(outside / "venv-link", tmp_path / "failed", "no-links")
        assert "cannot run" in failed["error"] and "No such file or directory" in failed["error"]
        assert "exit code 127" in failed["error"]
    finally:
        (outside / "venv-link").unlink(missing_ok=True)
        outside.rmdir()


def test_a_cache_inside_a_hidden_folder_stays_in_view(tmp_path: Path) -> None:
    """A local cluster keeps each worker's folder (and its build cache) beside the sockets it hides
    from runners: the cache is bound over the hidden folder's cover, so a candidate's extension
    built ahead is found there (covered, it was refused as never built)."""
    from specgen.messages import CandidateSubmission

    sockets = tmp_path / "cluster"
    sockets.mkdir()
    (sockets / "scheduler.sock").write_text("not for runners")
    options = EvalOptions(timeout_s=120.0, timing_trials=4, warmup=1, overhead_trials=5,
                          memory_limit_mb=2048)
    worker = EvalWorker("cpu", sockets / "work0", spare_processes=0, options=options,
                        hidden_paths=[sockets])
    worker.start()
    try:
        problem = BUNDLED / "softmax.py"
        candidate = BUNDLED / "candidates" / "softmax_cpp.py"
        verdict = worker.run(CandidateSubmission(
            job_id="", candidate_id="c", problem_name="softmax", problem_source=problem.read_text(),
            candidate_source=candidate.read_text()), "validate")
    finally:
        worker.close()
    assert verdict.correct and verdict.error is None, verdict.error
