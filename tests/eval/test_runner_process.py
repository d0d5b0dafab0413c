"""The judge's side of a runner: who is put in the runner's control group.

A runner's init says hello as soon as the template forks it. When that hello is already queued
before the judge reads it (a spare started ahead of need, a loaded machine), the pid the kernel
gives for it must still be the init's: a pid of 0 written to `cgroup.procs` moves the *judge* into
the runner's group, whose limit and kill then hit the worker (seen as `make test` killed mid-run).
The scenario runs in a child process, so that a judge killed that way fails this test and not the
test session.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specgen.eval import containment, sandbox

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
