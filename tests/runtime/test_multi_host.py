"""Several hosts: one `specgen serve` and three `specgen-node` processes started through their
command lines, as on four machines, joined over TCP with CURVE keys and the join secret.

Each "host" is a directory holding its own copies of what an operator copies to a node host
(docs/runtime.md, "Several hosts"): the scheduler's public key, a client keypair and the join
secret. Nodes bind no TCP port (their workers' notices use an ipc:// socket in the node's own
directory); only the scheduler listens. The last test runs a node in a network namespace of its
own, reaching a scheduler in another namespace over a veth pair, where namespaces are available.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from specgen.runtime.settings import SETTINGS_ENV

from tests.runtime.conftest import SLOW_CORRECT, alive, descendants, quick_eval_settings, wait_for

BIN = Path(sys.executable).parent
ENTRY = "specgen.runtime.jobs:evaluate_candidates"
STOP_WAIT_S = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPECGEN_KEYS", "SPECGEN_JOIN_SECRET_FILE", SETTINGS_ENV)}
    env[SETTINGS_ENV] = quick_eval_settings(peer_timeout_s=4.0).to_env()
    return env


@dataclass
class Proc:
    """A command started as a user would, its output in a log file."""
    name: str
    popen: subprocess.Popen
    log: Path
    tree: set[int] = field(default_factory=set)   # every process seen below it

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def note_tree(self) -> None:
        self.tree |= descendants(self.pid)


def start(name: str, argv: list[str], log_dir: Path, prefix: list[str] | None = None) -> Proc:
    log = log_dir / f"{name}.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen([*(prefix or []), *argv], stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=clean_env(), start_new_session=True)
    return Proc(name, popen, log)


def stop(proc: Proc) -> None:
    """SIGTERM, wait, then SIGKILL of its group and of anything left below it (bounded)."""
    proc.note_tree()
    if proc.popen.poll() is None:
        proc.popen.send_signal(signal.SIGTERM)
        try:
            proc.popen.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.popen.wait(5)
    deadline = time.monotonic() + 5
    while alive(proc.tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in alive(proc.tree):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def copy_to_host(scheduler_keys: Path, join_secret: Path, host: Path) -> tuple[Path, Path]:
    """What an operator copies to a node host: server.key (public), client.key and
    client.key_secret (secret, 0600), the join secret (secret, 0600). Never server.key_secret."""
    keys = host / "keys"
    keys.mkdir(parents=True)
    os.chmod(host, 0o700)
    for name in ("server.key", "client.key", "client.key_secret"):
        shutil.copy(scheduler_keys / name, keys / name)
    os.chmod(keys / "client.key_secret", 0o600)
    secret = host / "join_secret"
    shutil.copy(join_secret, secret)
    os.chmod(secret, 0o600)
    return keys, secret


def node_argv(address: str, name: str, keys: Path | None, secret: Path, host: Path) -> list[str]:
    argv = [str(BIN / "specgen-node"), "--scheduler", address, "--cpu-workers", "1", "--name", name,
            "--join-secret", str(secret), "--work-dir", str(host / "work")]
    return argv + (["--keys", str(keys)] if keys is not None else [])


def status_json(address: str, keys: Path, prefix: list[str] | None = None) -> dict:
    out = subprocess.run([*(prefix or []), str(BIN / "specgen"), "status", "--json", "--scheduler", address,
                          "--keys", str(keys)], capture_output=True, text=True, timeout=60, env=clean_env())
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@dataclass
class Cluster:
    root: Path
    address: str
    keys: Path                 # the scheduler host's key directory (a client there uses it too)
    join_secret: Path
    scheduler: Proc
    nodes: dict[str, Proc] = field(default_factory=dict)
    others: list[Proc] = field(default_factory=list)

    def client(self):
        import specgen

        return specgen.Client(self.address, keys=self.keys)

    def start_node(self, name: str) -> Proc:
        host = self.root / name
        keys, secret = copy_to_host(self.keys, self.join_secret, host)
        node = start(name, node_argv(self.address, name, keys, secret, host), self.root)
        self.nodes[name] = node
        return node


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("hosts")
    sched_host = root / "scheduler-host"
    keys = sched_host / "keys"
    made = subprocess.run([str(BIN / "specgen"), "keys", "generate", str(keys)], capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    state = sched_host / "state"
    address = f"tcp://127.0.0.1:{free_port()}"
    scheduler = start("scheduler", [str(BIN / "specgen"), "serve", "--bind", address, "--keys", str(keys),
                                    "--state-dir", str(state)], root)
    c = Cluster(root, address, keys, state / "join_secret", scheduler)
    try:
        wait_for(lambda: (state / "address").exists() or scheduler.popen.poll() is not None, 60,
                 "the scheduler to listen")
        assert scheduler.popen.poll() is None, scheduler.output()
        assert (state / "address").read_text().strip() == address
        assert (c.join_secret.stat().st_mode & 0o777) == 0o600
        for i in range(3):
            c.start_node(f"host{i + 1}")
        yield c
    finally:
        for proc in [*c.others, *c.nodes.values()]:
            stop(proc)
        stop(scheduler)


def wait_joined(c: Cluster, names: set[str], timeout: float = 120) -> dict:
    def joined():
        for name, node in c.nodes.items():
            assert node.popen.poll() is None or name not in names, f"{name} exited:\n{node.output()[-3000:]}"
        stats = status_json(c.address, c.keys)
        return stats if (set(stats["nodes"]) == names
                         and {w["node"] for w in stats["workers"]} == names
                         and len(stats["workers"]) == len(names)) else None
    return wait_for(joined, timeout, f"nodes {sorted(names)} and their workers to join", interval=0.5)


def verdicts(job) -> list[dict]:
    return [e.data for e in job.events(timeout=30) if e.kind == "verdict"]


def variants(source: str, n: int) -> dict[str, str]:
    """`n` distinct honest candidates (the same kernel; a comment tells them apart)."""
    return {f"honest{i}": f"{source}\n# variant {i}\n" for i in range(n)}


def test_three_nodes_join_over_tcp_with_curve(cluster: Cluster) -> None:
    stats = wait_joined(cluster, {"host1", "host2", "host3"})
    assert sorted(w["name"] for w in stats["workers"]) == ["host1/cpu0", "host2/cpu0", "host3/cpu0"]
    assert stats["hellos_refused"] == 0
    text = subprocess.run([str(BIN / "specgen"), "status", "--scheduler", cluster.address, "--keys",
                           str(cluster.keys)], capture_output=True, text=True, timeout=60, env=clean_env())
    assert text.returncode == 0, text.stderr
    for name in ("host1/cpu0", "host2/cpu0", "host3/cpu0"):
        assert name in text.stdout
    for name, node in cluster.nodes.items():
        assert f"specgen-node {name}: 1 worker(s) on cpu -> {cluster.address}" in node.output()


def test_a_batch_of_evaluations_spreads_over_the_nodes(
        cluster: Cluster, softmax_problem: str, softmax_candidate: str) -> None:
    wait_joined(cluster, {"host1", "host2", "host3"})
    with cluster.client() as client:
        job = client.submit(softmax_problem, entry=ENTRY, options={
            "candidates": variants(softmax_candidate, 6), "profile": False})
        result = job.result(timeout=180)
        got = verdicts(job)
    assert result.status == "succeeded", result
    assert sorted(v["candidate_id"] for v in got) == sorted(variants("", 6))
    assert all(v["correct"] for v in got), got
    nodes = {v["worker"].split("/")[0] for v in got}
    assert len(nodes) >= 2, f"every verdict came from one node: {got}"


def test_a_node_with_a_wrong_join_secret_or_keys_is_refused(cluster: Cluster) -> None:
    wait_joined(cluster, {"host1", "host2", "host3"})
    root = cluster.root
    # A wrong join secret: CURVE admits it (its keys are right), registration does not.
    host = root / "intruder"
    keys, secret = copy_to_host(cluster.keys, cluster.join_secret, host)
    secret.write_text(secrets.token_hex(32) + "\n")
    intruder = start("intruder", node_argv(cluster.address, "intruder", keys, secret, host), root)
    cluster.others.append(intruder)
    # No server public key: the node cannot even start.
    lost = root / "no-server-key"
    lost_keys, lost_secret = copy_to_host(cluster.keys, cluster.join_secret, lost)
    (lost_keys / "server.key").unlink()
    keyless = subprocess.run(node_argv(cluster.address, "keyless", lost_keys, lost_secret, lost),
                             capture_output=True, text=True, timeout=60, env=clean_env())
    assert keyless.returncode == 2
    assert "specgen-node: error: key file" in keyless.stderr and "server.key not found" in keyless.stderr
    # No keys at all off loopback would be refused too; on 127.0.0.1 a node without --keys talks
    # plain TCP to a CURVE server: it never gets through.
    plain = start("plain", node_argv(cluster.address, "plain", None, lost_secret, lost), root)
    cluster.others.append(plain)
    # Another cluster's server public key (keys regenerated, the new server.key not copied): the
    # CURVE handshake fails, so neither the node nor its worker ever says Hello.
    stale = root / "stale-server-key"
    stale_keys, stale_secret = copy_to_host(cluster.keys, cluster.join_secret, stale)
    other = root / "other-cluster-keys"
    assert subprocess.run([str(BIN / "specgen"), "keys", "generate", str(other)], capture_output=True,
                          timeout=60).returncode == 0
    shutil.copy(other / "server.key", stale_keys / "server.key")
    stale_node = start("stale", node_argv(cluster.address, "stale", stale_keys, stale_secret, stale), root)
    cluster.others.append(stale_node)

    wait_for(lambda: "unauthorized" in intruder.output() and "a wrong credential" in intruder.output(),
             60, "the node with a wrong secret to report its refusal")
    log = cluster.scheduler.output
    wait_for(lambda: "refused node 'intruder'" in log() and "refused worker 'intruder/cpu0'" in log(),
             60, "the scheduler to refuse the node and its worker")
    assert status_json(cluster.address, cluster.keys)["hellos_refused"] >= 2
    time.sleep(2)   # give the refused nodes time to retry (they keep saying Hello)
    stats = status_json(cluster.address, cluster.keys)
    assert intruder.popen.poll() is None and plain.popen.poll() is None and stale_node.popen.poll() is None
    assert "wrong credential" not in stale_node.output() + plain.output()   # refused before any Hello
    for name in ("intruder", "keyless", "plain", "stale"):
        assert name not in stats["nodes"]
        assert not [w for w in stats["workers"] if w["node"] == name or w["name"].startswith(name + "/")]
    assert sorted(stats["nodes"]) == ["host1", "host2", "host3"]
    for proc in (intruder, plain, stale_node):
        stop(proc)
        assert proc.popen.returncode == 0, proc.output()[-2000:]


def test_a_node_killed_mid_batch_loses_no_request(
        cluster: Cluster, softmax_problem: str, softmax_candidate: str) -> None:
    wait_joined(cluster, {"host1", "host2", "host3"})
    candidates = {"slow0": SLOW_CORRECT, "slow1": SLOW_CORRECT + "\n# 1\n", "slow2": SLOW_CORRECT + "\n# 2\n",
                  **variants(softmax_candidate, 3)}
    with cluster.client() as client:
        job = client.submit(softmax_problem, entry=ENTRY, options={"candidates": candidates, "profile": False})

        def busy_slow():
            return [w for w in client.stats().workers if "/slow" in w.busy_candidate]
        victim = wait_for(busy_slow, 120, "a worker to run a slow candidate")[0]
        node = cluster.nodes[victim.node]
        node.note_tree()
        time.sleep(0.3)                                   # inside its evaluation
        os.kill(node.pid, signal.SIGKILL)
        result = job.result(timeout=180)
        got = verdicts(job)
        stats = client.stats()
    assert result.status == "succeeded", result
    keys = sorted(v["candidate_id"] for v in got)
    assert keys == sorted(candidates), f"lost or repeated verdicts: {keys}"
    assert all(v["correct"] for v in got), got
    victim_candidate = victim.busy_candidate.split("/")[-1]
    redone = next(v for v in got if v["candidate_id"] == victim_candidate)
    assert not redone["worker"].startswith(victim.node + "/"), redone
    assert stats.requests_requeued >= 1
    with cluster.client() as client:
        wait_for(lambda: victim.node not in client.stats().nodes, 30, "the killed node to be declared lost")
        assert sorted(w.node for w in client.stats().workers) == sorted(set(cluster.nodes) - {victim.node})
    assert node.popen.wait(10) == -signal.SIGKILL
    wait_for(lambda: not alive(node.tree), 30, "the killed node's workers to go down with it")


# -- a node in a network namespace of its own ------------------------------------------------

def _netns_unavailable() -> str | None:
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces with `ip netns` needs root"
    probe = f"sgprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=20)
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=20)
    return None


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr}"


def test_a_node_in_its_own_network_namespace_joins_over_a_veth_pair(
        tmp_path: Path, softmax_problem: str, softmax_candidate: str) -> None:
    """Scheduler in namespace A listening on all its interfaces, a node in namespace B reaching it
    at A's veth address: a real non-loopback address, so CURVE is required, not just used. Only
    the two namespaces made here get addresses (10.213.N.1/30 and .2/30 on their veth ends)."""
    why = _netns_unavailable()
    if why:
        pytest.skip(f"network namespaces unavailable: {why}")
    tag = f"{os.getpid() % 100000}"
    ns_a, ns_b = f"sgsched{tag}", f"sgnode{tag}"
    octet = os.getpid() % 250 + 1
    addr_a, addr_b = f"10.213.{octet}.1", f"10.213.{octet}.2"
    procs: list[Proc] = []
    made: list[str] = []
    try:
        for ns in (ns_a, ns_b):
            ip("netns", "add", ns)
            made.append(ns)
        # Made inside namespace A, so no interface ever exists in the namespace the tests run in.
        ip("-n", ns_a, "link", "add", "veth-a", "type", "veth", "peer", "name", "veth-b", "netns", ns_b)
        ip("-n", ns_a, "addr", "add", f"{addr_a}/30", "dev", "veth-a")
        ip("-n", ns_b, "addr", "add", f"{addr_b}/30", "dev", "veth-b")
        for ns, dev in ((ns_a, "veth-a"), (ns_b, "veth-b")):
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "link", "set", dev, "up")
        in_a, in_b = ["ip", "netns", "exec", ns_a], ["ip", "netns", "exec", ns_b]

        keys = tmp_path / "scheduler-host" / "keys"
        generated = subprocess.run([str(BIN / "specgen"), "keys", "generate", str(keys)],
                                   capture_output=True, text=True, timeout=60)
        assert generated.returncode == 0, generated.stderr
        state = tmp_path / "scheduler-host" / "state"
        port = 5555
        scheduler = start("scheduler", [str(BIN / "specgen"), "serve", "--bind", f"tcp://0.0.0.0:{port}",
                                        "--keys", str(keys), "--state-dir", str(state)], tmp_path, prefix=in_a)
        procs.append(scheduler)
        wait_for(lambda: (state / "address").exists() or scheduler.popen.poll() is not None, 60,
                 "the scheduler to listen")
        assert scheduler.popen.poll() is None, scheduler.output()
        address = f"tcp://{addr_a}:{port}"

        host = tmp_path / "remote"
        host_keys, host_secret = copy_to_host(keys, state / "join_secret", host)
        # Off loopback a node without keys is refused before it starts.
        bare = subprocess.run([*in_b, *node_argv(address, "bare", None, host_secret, host)],
                              capture_output=True, text=True, timeout=60, env=clean_env())
        assert bare.returncode == 2 and "not a loopback address" in bare.stderr, bare.stderr
        node = start("remote", node_argv(address, "remote", host_keys, host_secret, host), tmp_path, prefix=in_b)
        procs.append(node)

        def joined():
            assert node.popen.poll() is None, node.output()[-3000:]
            stats = status_json(address, host_keys, prefix=in_b)   # a client on the node's host
            return stats if stats["nodes"] == ["remote"] and len(stats["workers"]) == 1 else None
        stats = wait_for(joined, 120, "the node in the other namespace to join", interval=0.5)
        assert stats["workers"][0]["name"] == "remote/cpu0"

        # A client on the node's host evaluates through the scheduler across the veth pair.
        script = ("import sys, specgen\n"
                  "with specgen.Client(sys.argv[1], keys=sys.argv[2]) as c:\n"
                  "    v = c.evaluate(open(sys.argv[3]).read(), open(sys.argv[4]).read(), stage='validate')\n"
                  "    print('CORRECT' if v.correct else 'WRONG', v.error)\n")
        (tmp_path / "problem.py").write_text(softmax_problem)
        (tmp_path / "candidate.py").write_text(softmax_candidate)
        evaluated = subprocess.run([*in_b, sys.executable, "-c", script, address, str(host_keys),
                                    str(tmp_path / "problem.py"), str(tmp_path / "candidate.py")],
                                   capture_output=True, text=True, timeout=150, env=clean_env(),
                                   cwd=str(Path(__file__).resolve().parents[2]))
        assert evaluated.returncode == 0 and "CORRECT" in evaluated.stdout, evaluated.stderr[-3000:]
    finally:
        for proc in reversed(procs):
            stop(proc)
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
