"""The judge's side of a runner: who is put in the runner's control group, the descriptors a
runner sends back, and its capped log.

A runner's init says hello as soon as the template forks it. When that hello is already queued
before the judge reads it (a spare started ahead of need, a loaded machine), the pid the kernel
gives for it must still be the init's: a pid of 0 written to `cgroup.procs` moves the *judge* into
the runner's group, whose limit and kill then hit the worker (seen as `make test` killed mid-run).
The scenario runs in a child process, so that a judge killed that way fails this test and not the
test session.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from specgen.eval import containment, sandbox
from specgen.eval.options import EvalOptions
from specgen.eval.protocol import Channel, socket_pair
from specgen.eval.runner_process import Runner, Template, capped_log, capped_log_tail
from specgen.messages import ParamsSet, RunnerExited, SetParams

SCENARIO = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from specgen.eval.options import EvalOptions
    from specgen.eval.runner_process import Template

    work, sandboxed = Path(sys.argv[1]), sys.argv[2] == "1"
    before = Path("/proc/self/cgroup").read_text()
    template = Template("cpu", work, EvalOptions(), sandboxed, work / "cache", [])
    runner = template.fork("candidate")
    time.sleep(1.5)                     # the init's hello is queued before anyone reads it
    runner.wait_ready(120)
    procs = []
    if runner.group is not None and runner.group.paths:
        procs = [int(p) for p in (runner.group.paths[0] / "cgroup.procs").read_text().split()]
    report = {"init_pid": runner.init_pid, "me": os.getpid(), "procs": procs,
              "moved": Path("/proc/self/cgroup").read_text() != before}
    runner.kill()
    template.close()
    print(json.dumps(report))
""")


def modes() -> list[bool]:
    possible = sandbox.namespaces_possible().kind == sandbox.NAMESPACES
    return [False, True] if possible else [False]


@pytest.mark.parametrize("sandboxed", modes(), ids=lambda s: "sandboxed" if s else "plain")
def test_a_hello_queued_before_it_is_read_still_names_the_init(tmp_path: Path,
                                                                sandboxed: bool) -> None:
    (tmp_path / "cache").mkdir()
    done = subprocess.run([sys.executable, "-c", SCENARIO, str(tmp_path), "1" if sandboxed else "0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["init_pid"] and report["init_pid"] > 0, report
    assert report["init_pid"] != report["me"] and not report["moved"], report
    if containment.probe().kind != containment.NONE:
        assert report["procs"] and report["me"] not in report["procs"], report


def test_a_group_refuses_pid_zero(tmp_path: Path) -> None:
    """The last line of defence: 0 never reaches `cgroup.procs`."""
    group = containment.RunGroup(containment.Containment(containment.NONE, "test"), "x", 16)
    with pytest.raises(ValueError, match="pid 0"):
        group.add(0)


# ---------------------------------------------------------------------- what a runner sends back

def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def runner_pair(tmp_path: Path, role: str = "candidate") -> tuple[Runner, Channel]:
    """A Runner over a socket pair whose other end the test plays (no process behind it)."""
    judge_end, runner_end = socket_pair()
    return (Runner(role, Channel(judge_end, "judge"), tmp_path / "log", None, None),  # type: ignore[arg-type]
            Channel(runner_end, "runner"))


def answer(end: Channel, replies: list, fds: tuple[int, ...], delay_s: float = 0.0
           ) -> threading.Thread:
    def serve() -> None:
        for reply in replies:
            end.recv(time.monotonic() + 10)
            time.sleep(delay_s)
            end.send(reply, fds=fds)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_descriptors_come_back_only_where_the_caller_expects_them(tmp_path: Path) -> None:
    runner, end = runner_pair(tmp_path)
    read_fd, write_fd = os.pipe()
    before = open_fds()
    thread = answer(end, [ParamsSet(error=str(i)) for i in range(21)], (write_fd,) * 4)
    for index in range(20):
        received, why = runner.request(SetParams(seed=index), time.monotonic() + 10, "test",
                                       lambda: False)
        assert why is None and received.message == ParamsSet(error=str(index)) and received.fds == []
    assert open_fds() == before
    received, why = runner.request(SetParams(seed=20), time.monotonic() + 10, "test",
                                   lambda: False, fds_expected=2)
    assert len(received.fds) == 2 and open_fds() == before + 2
    for fd in received.fds:
        os.close(fd)
    thread.join(5)
    runner.kill()
    for fd in (read_fd, write_fd):
        os.close(fd)


def test_a_dropped_reply_and_an_exit_notice_close_what_they_brought(tmp_path: Path) -> None:
    # A reference runner is waited for after a cancel (it is kept): its reply is dropped.
    runner, end = runner_pair(tmp_path, "reference")
    read_fd, write_fd = os.pipe()
    before = open_fds()
    answer(end, [ParamsSet()], (write_fd,) * 4, delay_s=0.3)    # comes after the cancel
    received, why = runner.request(SetParams(seed=1), time.monotonic() + 10, "test", lambda: True,
                                   fds_expected=4)
    assert received is None and why == "cancelled" and open_fds() == before
    end.send(RunnerExited(status=3), fds=(write_fd,) * 4)
    received, why = runner.receive(time.monotonic() + 10, "test", lambda: False, fds_expected=4)
    assert received is None and "exit code 3" in why
    assert open_fds() == before - 1            # and the runner's channel is closed with it
    for fd in (read_fd, write_fd):
        os.close(fd)


# ---------------------------------------------------------------------- the runner's log

def test_a_runners_log_cannot_grow_past_its_cap_and_its_end_is_readable() -> None:
    cap = 1 << 20
    log = capped_log("test-log", cap)
    line = b"y" * 1023 + b"\n"
    written = 0
    with pytest.raises(OSError):
        for _ in range(3 * cap // len(line)):       # three times the cap: it stops at the cap
            written += os.write(log, line)
    assert written <= cap and os.fstat(log).st_size == cap
    tail = capped_log_tail(log)
    assert "yyy" in tail and "reached its cap of 1 MiB" in tail
    # Sealed: the runner holding it cannot make it larger (or smaller) to write on.
    for size in (cap * 2, 0):
        with pytest.raises(OSError):
            os.ftruncate(log, size)
    os.close(log)
    short = capped_log("short")
    os.write(short, b"first\nspecgen runner: RuntimeError: last words\n")
    assert capped_log_tail(short) == "first | specgen runner: RuntimeError: last words"
    os.close(short)


def test_a_killed_runner_keeps_its_last_words_and_holds_no_descriptor(tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    before = open_fds()
    template = Template("cpu", tmp_path, EvalOptions(), False, tmp_path / "cache", [])
    with_template = open_fds()
    runner = template.fork("candidate")
    runner.wait_ready(120)
    os.write(runner._log_fd, b"said before the end\n")   # as the runner's own stderr would be
    runner.kill()
    assert runner.log_tail() == "said before the end"
    runner.remove_log()
    assert open_fds() == with_template
    # Nothing is left on the host's disk for the runner's output.
    assert not list((tmp_path / "logs").glob("candidate-*"))
    template.close()
    assert open_fds() <= before + 1                 # the template's own log file, if kept open
