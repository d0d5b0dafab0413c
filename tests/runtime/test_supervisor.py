"""The supervisor of a LocalCluster's processes, with real child processes: restarts, the budget,
a restart that fails, and how a death is described."""
from __future__ import annotations

import signal
import time

from specgen.runtime.child_process import ChildProcess
from specgen.runtime.supervisor import ProcessDied, ProcessSupervisor, describe_exit
from tests.runtime.conftest import wait_for


def test_how_a_death_is_described() -> None:
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"
    assert describe_exit(3) == "exited with status 3"
    assert describe_exit(-200) == "was killed by signal 200"


def _failing(supervisor: ProcessSupervisor) -> ChildProcess:
    """A process that exits with status 1 as soon as it starts (no such module)."""
    return ChildProcess("flaky", "specgen.no_such_module", on_exit=supervisor.exited)


def test_a_process_is_started_again_until_it_died_more_often_than_the_budget() -> None:
    given_up: list[ProcessDied] = []
    started: list[ChildProcess] = []

    def restart(child: ChildProcess) -> None:
        started.append(_failing(supervisor).start())

    supervisor = ProcessSupervisor(restart, max_restarts=2, on_give_up=given_up.append)
    supervisor.start()
    try:
        started.append(_failing(supervisor).start())
        wait_for(lambda: given_up, 30, "the supervisor to give up")
        assert len(started) == 3 and len(supervisor.restarts) == 2       # two restarts, then no more
        last = started[-1]
        assert last.proc.wait(5) == 1
        assert str(given_up[0]) == (f"the local cluster's flaky (pid {last.pid}) exited with status 1, "
                                    f"its death number 3 within 600 s, and is not started again "
                                    f"(setting cluster_max_restarts=2)")
        assert supervisor.failure is given_up[0] and given_up[0].pid == last.pid
    finally:
        supervisor.close()


def test_a_restart_that_fails_gives_up_at_once_saying_why() -> None:
    def restart(child: ChildProcess) -> None:
        raise OSError("no more processes")

    supervisor = ProcessSupervisor(restart, max_restarts=3)
    supervisor.start()
    try:
        child = _failing(supervisor).start()
        wait_for(lambda: supervisor.failure is not None, 30, "the supervisor to give up")
        assert str(supervisor.failure) == (f"the local cluster's flaky (pid {child.pid}) exited with status 1 "
                                           f"and could not be started again (OSError: no more processes)")
    finally:
        supervisor.close()


def test_a_process_stopped_on_purpose_or_while_holding_is_not_started_again() -> None:
    restarted: list[ChildProcess] = []
    supervisor = ProcessSupervisor(restarted.append, max_restarts=3)
    supervisor.start()
    try:
        asleep = ChildProcess("sleeper", "http.server", ["0", "--bind", "127.0.0.1"],
                              on_exit=supervisor.exited).start()
        asleep.stop(5.0)                              # asked for: not a death
        supervisor.hold()
        _failing(supervisor).start().proc.wait(5)     # the cluster is stopping: left alone
        time.sleep(1.0)
        assert restarted == [] and supervisor.failure is None
    finally:
        supervisor.close()
