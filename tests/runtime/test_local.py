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
