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
    kind = sandbox.probe().kind
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
