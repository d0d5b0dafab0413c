import pytest

from specgen.cli import main as cli_main
from specgen.runtime.local import LocalCluster
from specgen.runtime.settings import RuntimeSettings
from specgen.runtime.transport import RuntimeFailure


def test_argument_checks() -> None:
    with pytest.raises(ValueError, match="workers or devices"):
        LocalCluster(workers=3, devices=["cpu"])
    with pytest.raises(ValueError, match="at least one worker"):
        LocalCluster(workers=0)
    with pytest.raises(ValueError, match="either GPUs or CPU workers"):
        LocalCluster(devices=["cpu", "cuda:0"]).start()


def test_workers_that_cannot_start_fail_the_start_naming_the_setting() -> None:
    settings = RuntimeSettings(ready_timeout_s=4.0, worker_restart_backoff_s=0.2)
    with pytest.raises(RuntimeFailure, match="ready_timeout_s") as info:
        LocalCluster(workers=1, evaluator="replay:/nonexistent/recording.json", settings=settings).start()
    assert "cannot read replay recording" in str(info.value)


def test_status_command_prints_pools_and_workers(capsys: pytest.CaptureFixture) -> None:
    with LocalCluster(workers=2, evaluator="replay", address=None) as cluster:
        assert cli_main(["status", "--scheduler", cluster.address]) == 0
    out = capsys.readouterr().out
    assert "validate" in out and "profile" in out and "local0/cpu0" in out and "local0/cpu1" in out


def test_status_shows_how_each_worker_sandboxes_its_candidates(capsys: pytest.CaptureFixture) -> None:
    from specgen.eval import sandbox

    with LocalCluster(workers=1, address=None) as cluster:       # real evaluation workers
        workers = cluster.client.stats().workers
        assert cli_main(["status", "--scheduler", cluster.address]) == 0
    kind = sandbox.namespaces_possible().kind   # what the workers found with a real runner
    assert [w.sandbox.split(":")[0] for w in workers] == [kind]
    assert f"sandbox {kind}" in capsys.readouterr().out


HOLDER = """
import json, time
from specgen.runtime.local import LocalCluster
from specgen.runtime.settings import RuntimeSettings
cluster = LocalCluster(workers=2, evaluator="replay", settings=RuntimeSettings(shutdown_grace_s=2.0)).start()
print(json.dumps({"tmp": str(cluster.tmp), "workers": [w.pid for w in cluster.client.stats().workers]}), flush=True)
time.sleep(600)
"""


def test_a_killed_owner_takes_its_cluster_and_its_directory_with_it() -> None:
    import json
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from tests.runtime.conftest import alive, descendants, wait_for

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    owner = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        info = json.loads(owner.stdout.readline())
        tmp = Path(info["tmp"])
        cluster = descendants(owner.pid)
        assert set(info["workers"]) <= cluster and len(cluster) >= 4 and tmp.is_dir()
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        wait_for(lambda: not alive(cluster), 20, "the scheduler, node and workers to exit")
        wait_for(lambda: not tmp.exists(), 20, f"{tmp} to be removed")
    finally:
        if owner.poll() is None:
            owner.kill()
        owner.stdout.close()


# ------------------------------------------------------------------------------ supervision

def _worker_pids(cluster: LocalCluster) -> set[int]:
    return {w.pid for w in cluster.client.stats().workers}


def test_a_supervised_cluster_starts_a_killed_node_and_scheduler_again(tmp_path) -> None:
    import os
    import signal

    from tests.runtime.conftest import wait_for

    settings = RuntimeSettings(shutdown_grace_s=2.0, heartbeat_interval_s=0.25, peer_timeout_s=3.0)
    with LocalCluster(workers=2, evaluator="replay", settings=settings, state_dir=tmp_path / "state",
                      supervise=True) as cluster:
        old_workers = _worker_pids(cluster)
        node = cluster.nodes[0].pid
        os.kill(node, signal.SIGKILL)
        # Its workers die with it; the node started again starts new ones, which register.
        wait_for(lambda: cluster.nodes[0].pid != node and cluster.nodes[0].alive(), 10, "the node's restart")
        wait_for(lambda: len(_worker_pids(cluster) - old_workers) == 2, 60,
                 "the restarted node's workers to register")
        scheduler = cluster.scheduler.pid
        old_id = cluster.client.conn.scheduler_id
        os.kill(scheduler, signal.SIGKILL)
        wait_for(lambda: cluster.scheduler.pid != scheduler and cluster.scheduler.alive(), 10,
                 "the scheduler's restart")
        # Same address, same journal: the client and the workers register with it on their own.
        wait_for(lambda: len(cluster.client.stats().workers) == 2, 60, "the workers to rejoin")
        assert cluster.client.conn.scheduler_id != old_id
        assert [(name, pid, code) for name, pid, code in cluster.supervisor.restarts] == [
            ("node0", node, -signal.SIGKILL), ("scheduler", scheduler, -signal.SIGKILL)]
        assert cluster.failure is None


def test_a_cluster_that_gives_up_says_what_died_and_fails_every_wait_at_once() -> None:
    import os
    import signal
    import time

    from specgen.runtime.client import Job
    from specgen.runtime.supervisor import ProcessDied
    from tests.runtime.conftest import wait_for

    settings = RuntimeSettings(shutdown_grace_s=2.0, cluster_max_restarts=1)
    with LocalCluster(workers=1, evaluator="replay", settings=settings, supervise=True) as cluster:
        first = cluster.nodes[0].pid
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: cluster.nodes[0].pid != first and cluster.nodes[0].alive(), 10, "the node's restart")
        second = cluster.nodes[0].pid
        os.kill(second, signal.SIGTERM)        # not asked for by the cluster: a death as well
        wait_for(lambda: cluster.failure is not None, 10, "the supervisor to give up")
        assert str(cluster.failure) == (
            f"the local cluster's node0 (pid {second}) was killed by SIGTERM, its death number 2 within "
            f"600 s, and is not started again (setting cluster_max_restarts=1)")
        assert cluster.failure.pid == second and cluster.failure.exit_code == -signal.SIGTERM
        time.sleep(0.5)
        assert not cluster.nodes[0].alive()      # not started again
        started = time.monotonic()
        with pytest.raises(ProcessDied):
            cluster.client.stats()
        with pytest.raises(ProcessDied):
            Job(cluster.client, "some-job").result()
        assert time.monotonic() - started < 1.0


def test_the_cluster_directory_and_the_scheduler_state_are_private(tmp_path) -> None:
    import stat

    def mode(path):
        return stat.S_IMODE(path.stat().st_mode)

    state = tmp_path / "runs" / "state"
    with LocalCluster(workers=1, evaluator="replay", state_dir=state) as cluster:
        assert mode(cluster.tmp) == 0o700 and mode(cluster.tmp / "logs") == 0o700
        assert mode(state) == 0o700 and mode(state.parent) == 0o700
        files = [state / "journal.sqlite3", state / "address", *state.glob("journal.sqlite3-*"),
                 *(cluster.tmp / "logs").iterdir(), cluster.tmp / "node-pids"]
        assert len(files) >= 5
        for path in files:
            assert mode(path) == 0o600, path
