"""One machine, one call: a scheduler and its node(s) as real processes, and a client.

    with LocalCluster(workers=2) as cluster:            # 2 CPU workers (or devices=["cuda:0", ...])
        verdict = cluster.client.evaluate(problem, candidate)
        backend = cluster.backend()                       # an EvaluationBackend for the optimize loop

The scheduler listens on an ipc:// socket in a private temporary directory (nothing reachable from
the network); its journal lives in `state_dir` (a temporary directory unless given). Start-up waits
until every worker registered (setting `ready_timeout_s`); leaving the block stops everything
(SIGTERM, join, SIGKILL after `shutdown_grace_s`) and leaves no process behind.

`kv_control=True` (or the setting `kv_control_bind`) opens the scheduler's control channel for remote
KV pools; `cluster.kv_control_endpoint` is where a pool connects (`PoolControlAgent`, or vLLM's
`SpecgenOffloadingSpec` with `control_endpoint`), and the pools then show in `client.stats().kv_pools`.

The cluster's join secret (runtime/auth.py) is made here, held in memory and handed to the
scheduler and the nodes through their secrets pipes: it is never written to disk, and a restarted
scheduler (`start_scheduler()` again) gets the same one. `cluster.client` presents the admin
credential it gives (runtime/ownership.py): it sees and acts for every job of the cluster, as the
process that owns the cluster should; `Client(cluster.address)` is a plain client, with its own jobs.

`supervise=True` (as `specgen optimize` and `specgen bench` start it) keeps the scheduler and the
nodes running (runtime/supervisor.py): one that dies is started again at once, on the same address
and journal. A restarted scheduler resumes its jobs from the journal (their reasoners start again
and continue from theirs) and every node, worker and client registers with it again on its own; a
restarted node starts its workers again, which register under their old names (what the dead
ones ran goes back to its queue). A process that died more than `cluster_max_restarts` times in
10 minutes, or cannot be started again, is not: `cluster.failure` says what died, and the
cluster's client is closed with that error, so whatever waits on it (a request, a job's events)
fails at once instead of waiting for a scheduler or workers that will not come back.

If the process that started the cluster dies (even by SIGKILL), the scheduler and the nodes get
SIGTERM (PR_SET_PDEATHSIG, `process.die_with_parent`) and stop, and the scheduler removes the
cluster's temporary directory once the nodes have exited (`remove_orphaned_cluster_dir`). That
is decided here rather than by a sweep of stale directories at the next start because only a
process of the cluster knows for sure the directory is no longer used, and nothing is left behind
even when no cluster is ever started again.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import msgspec

from specgen.runtime.auth import new_join_secret
from specgen.processes import pid_alive
from specgen.runtime.child_process import ChildProcess, log_tail
from specgen.runtime.client import Client
from specgen.runtime.private_files import open_private
from specgen.runtime.scheduler_backend import SchedulerEvaluationBackend
from specgen.runtime.settings import SETTINGS_ENV, RuntimeSettings
from specgen.runtime.supervisor import ProcessDied, ProcessSupervisor
from specgen.runtime.transport import RuntimeFailure


class LocalCluster:
    where = "this machine's scheduler"

    def __init__(
        self,
        workers: int | None = None,
        devices: list[str] | None = None,
        *,
        nodes: int = 1,
        settings: RuntimeSettings | None = None,
        evaluator: str = "eval",
        state_dir: Path | None = None,
        address: str | None = None,
        kv_control: bool = False,
        metrics_port: int | None = None,
        supervise: bool = False,
    ) -> None:
        if devices is None:
            devices = ["cpu"] * (workers if workers is not None else 1)
        elif workers is not None and workers != len(devices):
            raise ValueError("pass workers or devices (or both, agreeing)")
        if not devices:
            raise ValueError("a LocalCluster needs at least one worker")
        self.devices = devices
        self.nodes_count = nodes
        self.settings = settings or RuntimeSettings()
        self.evaluator = evaluator
        self.tmp = Path(tempfile.mkdtemp(prefix="specgen-local-"))   # mode 0700
        self.join_secret = new_join_secret()
        self.state_dir = state_dir or self.tmp / "state"
        self.address = address or f"ipc://{self.tmp}/scheduler.sock"
        if kv_control and self.settings.kv_control_bind is None:
            self.settings = msgspec.structs.replace(self.settings, kv_control_bind=f"ipc://{self.tmp}/kv-control.sock")
        self.kv_control_endpoint: str | None = None   # the bound address, once started
        self.metrics_port = metrics_port              # the scheduler's --metrics-port (None: off)
        self.scheduler: ChildProcess | None = None
        self.nodes: list[ChildProcess] = []            # by node index
        self._node_devices: list[list[str]] = []       # by node index: what a restarted node serves
        self.supervisor = (ProcessSupervisor(self._restart, self.settings.cluster_max_restarts,
                                             on_give_up=self._gave_up) if supervise else None)
        self.client: Client | None = None  # type: ignore[assignment]
        self._backends: list[SchedulerEvaluationBackend] = []

    # -- processes --------------------------------------------------------------------------
    def start_scheduler(self) -> ChildProcess:
        self.scheduler = ChildProcess(
            "scheduler", "specgen.runtime.scheduler",
            ["--bind", self.address, "--state-dir", str(self.state_dir), "--remove-if-orphaned", str(self.tmp)]
            + (["--metrics-port", str(self.metrics_port)] if self.metrics_port is not None else []),
            env={SETTINGS_ENV: self.settings.to_env()}, log_path=self.tmp / "logs" / "scheduler.log",
            secrets={"join_secret": self.join_secret.hex()}, on_exit=self._on_exit,
        ).start()
        return self.scheduler

    def _node_args(self, devices: list[str], index: int) -> list[str]:
        args = ["--scheduler", self.address, "--name", f"local{index}", "--evaluator", self.evaluator,
                "--work-dir", str(self.tmp / f"work{index}")]
        gpus = [d.split(":")[1] for d in devices if d.startswith("cuda:")]
        if gpus and len(gpus) != len(devices):
            raise ValueError("a node serves either GPUs or CPU workers; split devices across nodes")
        return args + (["--gpus", ",".join(gpus)] if gpus else ["--cpu-workers", str(len(devices))])

    def start_node(self, devices: list[str], index: int) -> ChildProcess:
        node = ChildProcess(
            f"node{index}", "specgen.runtime.node", self._node_args(devices, index),
            env={SETTINGS_ENV: self.settings.to_env()}, log_path=self.tmp / "logs" / f"node{index}.log",
            secrets={"join_secret": self.join_secret.hex()}, on_exit=self._on_exit,
        ).start()
        if index < len(self.nodes):
            self.nodes[index], self._node_devices[index] = node, devices   # a restarted node
        else:
            self.nodes.append(node)
            self._node_devices.append(devices)
        with open_private(self.tmp / _NODE_PIDS, "a") as f:   # what an orphaned scheduler waits for
            f.write(f"{node.pid}\n")
        return node

    def start(self) -> "LocalCluster":
        try:
            self.start_scheduler()
            per_node = [self.devices[i::self.nodes_count] for i in range(self.nodes_count)]
            for i, devs in enumerate(d for d in per_node if d):
                self.start_node(devs, i)
            self.client = Client(self.address, settings=self.settings, join_secret=self.join_secret)
            self.wait_for_workers(len(self.devices))
            if self.settings.kv_control_bind is not None:
                self.kv_control_endpoint = self.client.stats().kv_control_endpoint
        except BaseException:
            self.stop()
            raise
        if self.supervisor is not None:
            # Supervised from here on: a process that dies while the cluster starts fails the
            # start (above), as a bad setup should, rather than being started again and again.
            self.supervisor.start()
        return self

    # -- supervision (supervise=True) -----------------------------------------------------------
    @property
    def failure(self) -> ProcessDied | None:
        """What died for good (the supervisor gave up), else None."""
        return self.supervisor.failure if self.supervisor is not None else None

    def _on_exit(self, child: ChildProcess, code: int) -> None:
        if self.supervisor is not None:
            self.supervisor.exited(child, code)

    def _restart(self, child: ChildProcess) -> None:
        """The supervisor's thread: start `child`, which died, again in its place."""
        if child is self.scheduler:
            self.start_scheduler()
        elif child in self.nodes:
            index = self.nodes.index(child)
            self.start_node(self._node_devices[index], index)

    def _gave_up(self, failure: ProcessDied) -> None:
        client = self.client
        if client is not None:
            client.close(error=failure)

    @property
    def metrics_url(self) -> str | None:
        """Where the scheduler serves its Prometheus metrics (None when off or not yet up)."""
        path = self.state_dir / "metrics_address"
        return path.read_text().strip() if self.metrics_port is not None and path.exists() else None

    def wait_for_workers(self, count: int, timeout: float | None = None) -> None:
        timeout = self.settings.ready_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            assert self.client is not None
            if len(self.client.stats().workers) >= count:
                return
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {n.name}:\n{log_tail(n.log_path)}" for n in self.nodes)
                raise RuntimeFailure(
                    f"only {len(self.client.stats().workers)} of {count} workers registered within "
                    f"{timeout:g} s (setting ready_timeout_s)\n{tails}")
            for node in self.nodes:
                if not node.alive():
                    raise RuntimeFailure(f"{node.name} exited:\n{log_tail(node.log_path)}")
            time.sleep(0.1)

    def backend(self) -> SchedulerEvaluationBackend:
        assert self.client is not None, "start the cluster first"
        backend = SchedulerEvaluationBackend(self.client)
        self._backends.append(backend)
        return backend

    def stop(self) -> None:
        if self.supervisor is not None:
            self.supervisor.hold()    # what stops now stays stopped
        for backend in self._backends:
            backend.close()
        if self.client is not None:
            self.client.close()
            self.client = None
        grace = self.settings.shutdown_grace_s
        for node in self.nodes:
            node.stop(grace)
        if self.scheduler is not None:
            self.scheduler.stop(grace)
        if self.supervisor is not None:
            self.supervisor.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_NODE_PIDS = "node-pids"


def remove_orphaned_cluster_dir(tmp: Path, settings: RuntimeSettings) -> None:
    """Called by a LocalCluster's scheduler that stopped because its parent died: wait until the
    cluster's nodes (which got SIGTERM too and stop their workers first) have exited, so that
    none of them writes there any more, then remove the cluster's directory."""
    tmp = Path(tmp)
    if not tmp.name.startswith("specgen-local-"):
        return   # only ever a LocalCluster's own directory
    try:
        pids = [int(line) for line in (tmp / _NODE_PIDS).read_text().split()]
    except (OSError, ValueError):
        pids = []
    # A node stops its workers in parallel: SIGTERM, `shutdown_grace_s`, SIGKILL.
    deadline = time.monotonic() + 2 * settings.shutdown_grace_s + 5.0
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    shutil.rmtree(tmp, ignore_errors=True)
