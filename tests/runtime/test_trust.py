"""Who may register and answer, with real processes: a peer that only reaches the socket, a
candidate kernel trying to pass for a worker, and where the secrets are (and are not)."""
from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
import zmq

from specgen.messages import PROTOCOL_VERSION, CandidateUpdate, ErrorReply, Hello, Verdict, WorkDone, Welcome
from specgen.runtime import wire
from specgen.runtime.auth import peer_credential
from specgen.runtime.local import LocalCluster

from tests.runtime.conftest import descendants, quick_eval_settings


def _ask(ctx: zmq.Context, address: str, msg) -> object:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send_multipart(wire.encode(msg))
        return wire.decode(sock.recv_multipart(), 1 << 30), sock
    except BaseException:
        sock.close(0)
        raise


def test_a_peer_that_only_reaches_the_socket_cannot_register_as_worker_or_node() -> None:
    with LocalCluster(workers=1, evaluator="replay") as cluster:
        ctx = zmq.Context()
        try:
            for hello in (Hello(role="worker", name="local0/cpu0", node="local0"),
                          Hello(role="worker", name="local0/cpu9", node="local0", credential="ab" * 32),
                          Hello(role="node", name="local0"),
                          Hello(role="reasoner", name="some-job")):
                reply, sock = _ask(ctx, cluster.address, hello)
                sock.close(0)
                assert isinstance(reply, ErrorReply) and reply.code == "unauthorized", reply
            # As a client it is welcome, but it cannot answer work.
            reply, sock = _ask(ctx, cluster.address, Hello(role="client", name="curious"))
            assert isinstance(reply, Welcome)
            upd = CandidateUpdate(job_id="", candidate_id="x", stage="validate", verdict=Verdict(correct=True))
            sock.send_multipart(wire.encode(WorkDone(call_id=3, request_id="r", update=upd)))
            err = wire.decode(sock.recv_multipart(), 1 << 30)
            assert isinstance(err, ErrorReply) and err.code == "unexpected"
            sock.close(0)
        finally:
            ctx.destroy(linger=0)
        stats = cluster.client.stats()
        assert stats.hellos_refused == 4 and [w.name for w in stats.workers] == ["local0/cpu0"]


def test_no_process_of_the_cluster_has_a_secret_in_its_environment() -> None:
    with LocalCluster(workers=2, evaluator="replay") as cluster:
        secret = cluster.join_secret.hex()
        creds = [peer_credential(cluster.join_secret, "worker", w.name, w.node)
                 for w in cluster.client.stats().workers]
        creds.append(peer_credential(cluster.join_secret, "node", "local0"))
        pids = {cluster.scheduler.pid, *(n.pid for n in cluster.nodes)}
        pids |= set().union(*(descendants(pid) for pid in set(pids)))
        assert len(pids) >= 4
        for pid in pids:
            environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            for value in (secret, *creds):
                assert value not in environ and value not in cmdline, pid
            assert "SPECGEN_CURVE" not in environ


PROBE = '''import json
import os

import msgspec
import torch
import torch.nn as nn
import zmq

ADDRESS = {address!r}
HELLO = {header!r}


def _probe():
    ctx = zmq.Context()
    seen = []
    for role, name, node in (("worker", "local0/cpu0", "local0"), ("node", "local0", "")):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(ADDRESS)
        sock.send(HELLO + msgspec.msgpack.encode({{"role": role, "name": name, "node": node}}))
        if sock.poll(3000):
            frame = sock.recv()
            seen.append([role, frame[3], msgspec.msgpack.decode(frame[4:]).get("code", "")])
        else:
            seen.append([role, 0, "silent"])
        sock.close()
    ctx.term()
    return seen


REPORT = {{"seen": _probe(), "env": sorted(k for k in os.environ
                                          if "SECRET" in k or "CURVE" in k or "CREDENTIAL" in k)}}
raise RuntimeError("PROBE " + json.dumps(REPORT))


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
'''


@pytest.mark.parametrize("sandbox", ["off", "default"])
def test_a_candidate_kernel_cannot_pass_for_a_worker(softmax_problem: str, sandbox: str) -> None:
    """The attack that found the hole: at import time a candidate says Hello as a worker (and as
    its node) to the scheduler it runs for. Refused (or, sandboxed, it cannot even reach it), it
    gets no one else's work, and its runner holds no secret to do better. Without the sandbox
    the scheduler's refusal alone stops it."""
    settings = quick_eval_settings()
    if sandbox != "default":
        settings = msgspec.structs.replace(settings, eval_options=msgspec.structs.replace(
            settings.eval_options, sandbox=sandbox))
    with LocalCluster(workers=1, settings=settings) as cluster:
        header = wire.MAGIC + bytes((PROTOCOL_VERSION, Hello.KIND))
        probe = PROBE.format(address=cluster.address, header=header)
        verdict = cluster.client.evaluate(softmax_problem, probe, stage="validate")
        assert not verdict.correct and "PROBE " in (verdict.error or ""), verdict.error
        report = json.loads(verdict.error.split("PROBE ", 1)[1].splitlines()[0])
        assert report["env"] == []
        error_kind = ErrorReply.KIND
        for role, kind, code in report["seen"]:
            assert code == "silent" or (kind == error_kind and code == "unauthorized"), report
        if sandbox == "off":
            assert [code for *_, code in report["seen"]] == ["unauthorized", "unauthorized"]
        stats = cluster.client.stats()
        assert stats.hellos_refused == sum(1 for *_, code in report["seen"] if code != "silent")
        assert [w.name for w in stats.workers] == ["local0/cpu0"] and stats.results_refused == 0
