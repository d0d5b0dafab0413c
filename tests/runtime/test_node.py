"""specgen-node supervising real worker processes that run real evaluations (CPU workers)."""
from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from specgen.messages import JobEvent
from specgen.runtime.client import Job
from specgen.runtime.local import LocalCluster
from specgen.runtime.node import main as node_main

from tests.runtime.conftest import (
    SLOW_CORRECT, WRONG, alive, descendants, processes_in_groups, quick_eval_settings, wait_for,
)

ENTRY = "specgen.runtime.jobs:evaluate_candidates"


def verdict_keys(events: list[JobEvent]) -> list[tuple[str, str]]:
    return [(e.data["candidate_id"], e.data["stage"]) for e in events if e.kind == "verdict"]


def all_events(job: Job) -> list[JobEvent]:
    return list(job.events(timeout=30))


def busy_with(cluster: LocalCluster, candidate: str):
    for w in cluster.client.stats().workers:
        if w.busy_candidate.endswith("/" + candidate):
            return w
    return None


def test_worker_killed_mid_request_its_request_runs_elsewhere(softmax_problem: str, softmax_candidate: str) -> None:
    with LocalCluster(workers=2, settings=quick_eval_settings()) as cluster:
        job = cluster.client.submit(softmax_problem, entry=ENTRY, options={
            "candidates": {"slow": SLOW_CORRECT, "fast": softmax_candidate, "wrong": WRONG}})
        victim = wait_for(lambda: busy_with(cluster, "slow"), 120, "a worker to run the slow candidate")
        time.sleep(0.5)                                   # well inside its evaluation
        os.kill(victim.pid, signal.SIGKILL)
        result = job.result(timeout=240)
        events = all_events(job)
        keys = verdict_keys(events)
        assert len(keys) == len(set(keys)), f"a stage was reported twice: {keys}"
        assert set(keys) == {("slow", "validate"), ("slow", "profile"), ("fast", "validate"),
                             ("fast", "profile"), ("wrong", "validate")}
        assert result.status == "succeeded"
        assert result.summary["validated"] == 3 and result.summary["profiled"] == 2
        stats = cluster.client.stats()
        assert stats.requests_requeued >= 1
        # The node restarted the killed worker under the same name.
        restarted = wait_for(lambda: [w for w in cluster.client.stats().workers if w.name == victim.name
                                      and w.pid != victim.pid], 120, "the node to restart the worker")
        assert restarted[0].pid != victim.pid


def test_node_cut_off_its_requests_are_requeued_and_late_answers_ignored(
        softmax_problem: str, softmax_candidate: str) -> None:
    settings = quick_eval_settings(peer_timeout_s=2.5)
    with LocalCluster(workers=2, nodes=2, settings=settings) as cluster:
        assert len({w.node for w in cluster.client.stats().workers}) == 2
        job = cluster.client.submit(softmax_problem, entry=ENTRY, options={
            "candidates": {"slow": SLOW_CORRECT, "fast": softmax_candidate}})
        victim = wait_for(lambda: busy_with(cluster, "slow"), 120, "a worker to run the slow candidate")
        node = next(n for n in cluster.nodes if n.name == "node" + victim.node.removeprefix("local"))
        # The host goes silent (its processes stop: no heartbeats, no answers).
        for pid in (node.pid, victim.pid):
            os.kill(pid, signal.SIGSTOP)
        try:
            result = job.result(timeout=240)
            keys = verdict_keys(all_events(job))
            assert len(keys) == len(set(keys))
            assert {("slow", "validate"), ("slow", "profile")} <= set(keys)
            assert result.status == "succeeded"
            stats = cluster.client.stats()
            assert stats.requests_requeued >= 1
            assert victim.node not in stats.nodes
        finally:
            for pid in (victim.pid, node.pid):
                os.kill(pid, signal.SIGCONT)
        # Back online: the node and its worker register again; the worker's late result is ignored.
        wait_for(lambda: victim.node in cluster.client.stats().nodes, 60, "the node to come back")
        wait_for(lambda: cluster.client.stats().duplicates_ignored >= 1, 120, "the late result to be ignored")
        assert job.status().updates == len(keys)


def test_stopping_a_cluster_leaves_no_process_behind(softmax_problem: str, softmax_candidate: str) -> None:
    cluster = LocalCluster(workers=2, settings=quick_eval_settings()).start()
    try:
        verdict = cluster.client.evaluate(softmax_problem, softmax_candidate, stage="validate")
        assert verdict.correct
        tops = {cluster.scheduler.pid, *(n.pid for n in cluster.nodes)}
        started = tops | set().union(*(descendants(pid) for pid in tops))
        workers = {w.pid for w in cluster.client.stats().workers}
        assert workers <= started and len(started) > len(tops) + len(workers)   # runners too
    finally:
        cluster.stop()
    assert alive(started) == set()
    assert processes_in_groups(started) == []


def test_node_command_line_errors_are_one_line(capsys: pytest.CaptureFixture) -> None:
    assert node_main(["--scheduler", "ipc:///tmp/x", "--gpus", "zero"]) == 2
    assert "--gpus expects comma-separated GPU indices" in capsys.readouterr().err
    assert node_main(["--scheduler", "ipc:///tmp/x", "--gpus", "0", "--cpu-workers", "2"]) == 2
    assert node_main(["--scheduler", "tcp://10.1.2.3:5555", "--cpu-workers", "1"]) == 2
    assert "not a loopback address" in capsys.readouterr().err


@contextlib.contextmanager
def _curve_scheduler_and_node(tmp_path, scheduler_keys, node_keys, settings, *node_args: str):
    """A scheduler on TCP with CURVE (`scheduler_keys`) and a node given `node_keys`, as separate
    processes; yields (address, node log path)."""
    from specgen.runtime.child_process import ChildProcess
    from specgen.runtime.settings import SETTINGS_ENV

    state = tmp_path / "state"
    env = {SETTINGS_ENV: settings.to_env()}
    scheduler = ChildProcess("scheduler", "specgen.runtime.scheduler",
                             ["--bind", "tcp://127.0.0.1:*", "--state-dir", str(state), "--keys", str(scheduler_keys)],
                             env=env, log_path=tmp_path / "s.log").start()
    node = None
    try:
        address = wait_for(lambda: (state / "address").exists() and (state / "address").read_text().strip(),
                           30, "the scheduler to listen")
        log = tmp_path / "n.log"
        node = ChildProcess("node", "specgen.runtime.node",
                            ["--scheduler", address, "--keys", str(node_keys), "--evaluator", "replay",
                             "--join-secret", str(state / "join_secret"), *node_args],
                            env=env, log_path=log).start()
        yield address, log
    finally:
        if node is not None:
            node.stop(5)
        scheduler.stop(5)


def test_node_and_workers_authenticate_with_curve_keys_over_tcp(tmp_path) -> None:
    """A node reaching the scheduler over TCP: its workers get its CURVE keys, and credentials
    derived from the join secret the scheduler wrote to its state directory."""
    import specgen
    from specgen.runtime.auth import generate
    from specgen.runtime.replay_evaluator import ReplaySample, directive
    from specgen.runtime.settings import RuntimeSettings

    keys = tmp_path / "keys"
    generate(keys)
    with _curve_scheduler_and_node(tmp_path, keys, keys, RuntimeSettings(), "--cpu-workers", "2",
                                   "--name", "remote") as (address, _):
        with specgen.Client(address, keys=keys) as client:
            wait_for(lambda: len(client.stats().workers) == 2, 60, "both workers to register over CURVE")
            assert client.stats().nodes == ["remote"]
            v = client.evaluate("class Model: pass\n", directive(ReplaySample(validate_s=0.01, correct=True,
                                                                              profile_s=0.01, speedup=2.0)))
            assert v.correct and v.speedup == 2.0


def test_a_node_with_a_stale_server_key_says_why_it_is_not_registered(tmp_path) -> None:
    """The node's copy of the server's public key is from another key set: the CURVE handshake
    cannot succeed, and instead of trying in silence the node logs why, every connect_timeout_s."""
    import shutil

    from specgen.runtime.auth import generate
    from specgen.runtime.settings import RuntimeSettings

    keys, other, stale = tmp_path / "keys", tmp_path / "other", tmp_path / "stale"
    generate(keys)
    generate(other)
    shutil.copytree(keys, stale)
    shutil.copy(other / "server.key", stale / "server.key")
    with _curve_scheduler_and_node(tmp_path, keys, stale, RuntimeSettings(connect_timeout_s=1.0),
                                   "--cpu-workers", "1", "--name", "stale") as (address, log):
        said = wait_for(lambda: log.exists() and "not registered with the scheduler yet" in log.read_text()
                        and log.read_text(), 30, "the node to say why it is not registered")
        assert f"no answer from the scheduler at {address}" in said


def test_a_gpu_named_several_times_gets_one_worker_each() -> None:
    from specgen.runtime.node import NodeActor

    node = object.__new__(NodeActor)
    node.name = "n"
    node.init_slots(["cuda:0", "cuda:0", "cuda:1"])
    assert sorted(node.slots) == ["n/gpu0.0", "n/gpu0.1", "n/gpu1"]
    assert [s.device for s in node.slots.values()] == ["cuda:0", "cuda:0", "cuda:1"]
    # The two on GPU 0 split its memory; the one on GPU 1 has it to itself.
    node.scheduler, node.notices_address, node.evaluator = "ipc:///x", "ipc:///y", "eval"
    node.work_dir = Path("/tmp/w")
    assert [node.worker_config(s).gpu_sharers for s in node.slots.values()] == [2, 2, 1]


def test_deaths_while_judging_a_candidate_do_not_use_up_the_restart_budget(tmp_path) -> None:
    """A candidate that takes its worker down is the candidate's doing: the node restarts the
    worker without counting it against worker_max_restarts (a stream of hostile candidates made a
    node give up on its workers), and the scheduler hears which candidate it was judging."""
    import json
    from types import SimpleNamespace

    from specgen.runtime.node import NodeActor
    from specgen.runtime.settings import RuntimeSettings
    from specgen.runtime.worker import IN_FLIGHT

    node = object.__new__(NodeActor)
    node.name, node.work_dir, node.stopping = "n", tmp_path, False
    node.settings = RuntimeSettings(worker_max_restarts=2, worker_restart_backoff_s=0.0)
    sent = []
    node.conn = SimpleNamespace(send=sent.append)
    node.init_slots(["cpu"])
    slot = next(iter(node.slots.values()))
    pids = iter(range(1000, 2000))

    def dies(judging: bool, code: int = -9) -> None:
        slot.child = SimpleNamespace(name=slot.name, pid=next(pids), log_path=None)
        if judging:
            node.worker_dir(slot).mkdir(parents=True, exist_ok=True)
            (node.worker_dir(slot) / IN_FLIGHT).write_text(json.dumps(
                {"pid": slot.child.pid, "request_id": "q", "candidate": "job/c1", "stage": "validate"}))
        node._on_exit(slot.child, code)

    for _ in range(10):
        dies(judging=True)
        assert slot.state == "restarting"
    assert slot.candidate_deaths == 10 and len(slot.restarts) == 0
    assert sent[-1].reason.startswith("exited with code -9 while judging job/c1 validate")
    assert node._health()["health"][slot.name]["candidate_deaths"] == 10
    # A mark left by an earlier process of the worker does not excuse this one's death.
    (node.worker_dir(slot) / IN_FLIGHT).write_text(json.dumps({"pid": 1, "candidate": "job/c2"}))
    dies(judging=False, code=1)
    assert len(slot.restarts) == 1 and "while judging" not in sent[-1].reason
    # Its own deaths still count: past worker_max_restarts it is given up on.
    dies(judging=False, code=1)
    dies(judging=False, code=1)
    assert slot.state == "failed"
