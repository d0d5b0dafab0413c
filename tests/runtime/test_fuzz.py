"""Socket fuzzing of a real cluster: every socket that takes frames from other processes gets
10,000 messages of garbage, truncated, mutated, oversized and multi-part frames, then honest
requests must still succeed and no actor may have grown by 50 MB or more.

The sockets: the scheduler's ROUTER (reached as any client reaches it, from peers that never
registered: each message gets exactly one reply, an ErrorReply for each that does not decode),
its KV pools' control channel (no replies: a bad frame is counted and dropped) and a node's
PULL socket for its workers' notices (dropped with a warning). Workers listen on nothing: they
connect to the scheduler and to their node, and what their runner subprocesses write back is
covered by tests/runtime/test_decoders.py. Frames come from a seeded generator, so a failure
repeats.
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import msgspec
import msgspec.inspect as mi
import pytest
import zmq

from specgen.kv.pool_control import PoolControlClient
from specgen.messages import (
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    DeadNotice,
    ErrorReply,
    Heartbeat,
    Hello,
    KvPoolResize,
    KvPoolStats,
    WorkerReady,
)
from specgen.runtime import wire
from specgen.runtime.local import LocalCluster
from specgen.runtime.worker import CONFIG_ENV
from tests.runtime.conftest import descendants, quick_eval_settings, wait_for

FRAMES = 10_000
MAX_MESSAGE = 1 << 20
TRANSPORT_LIMIT = 2 * MAX_MESSAGE + 65536   # transport.configure: a bigger frame disconnects its peer
RSS_GROWTH_LIMIT = 50 * 1024 * 1024
DEEP = "\x00deep\x00"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


class FrameFuzzer:
    """Seeded frames: random bytes and mutations (truncated, bytes flipped, a field of the wrong
    type, another version or kind, nested too deeply, oversized, several frames) of valid messages."""

    def __init__(self, seed: int, templates: list[msgspec.Struct], frame_of) -> None:
        self.rng = random.Random(seed)
        self.templates = templates
        self.frame_of = frame_of          # message -> its frame (bytes)

    # -- random valid values from the structs' type information --------------------------------
    def value(self, t: mi.Type, depth: int = 0) -> object:
        r = self.rng
        if isinstance(t, mi.StructType):
            return t.cls(**{f.name: self.value(f.type, depth + 1) for f in t.fields
                            if f.required or r.random() < 0.3})
        if isinstance(t, mi.StrType):
            return r.choice(["", "validate", "profile", "full", "local0/cpu0", "job-1", "x" * r.randrange(200),
                             "\u00e9\u4e2d\U0001f600"])
        if isinstance(t, mi.IntType):
            return r.choice([0, 1, -1, 2**63 - 1, -2**63, r.randrange(10**6)])
        if isinstance(t, mi.FloatType):
            return r.choice([0.0, 1.5, -1.0, 1e300, float("inf")])
        if isinstance(t, mi.BoolType):
            return r.random() < 0.5
        if isinstance(t, mi.BytesType):
            return r.randbytes(r.randrange(64))
        if isinstance(t, mi.NoneType):
            return None
        if isinstance(t, mi.UnionType):
            return self.value(r.choice(t.types), depth)
        if isinstance(t, mi.ListType):
            return [self.value(t.item_type, depth + 1) for _ in range(r.randrange(3 if depth < 3 else 1))]
        if isinstance(t, mi.DictType):
            return {self.value(t.key_type, depth + 1): self.value(t.value_type, depth + 1)
                    for _ in range(r.randrange(3 if depth < 3 else 1))}
        if isinstance(t, mi.AnyType):
            return self.wrong_value()
        if isinstance(t, mi.LiteralType):
            return r.choice(t.values)
        raise AssertionError(f"no random value for {t!r}")

    def wrong_value(self) -> object:
        r = self.rng
        return r.choice([None, True, -7, 2**64 - 1, 3.25, "", "text", b"\x00\xff", [1, "a", None],
                         {"k": [1, {"n": 2}]}, {1: 2}, [[[[]]]]])

    def valid(self) -> msgspec.Struct:
        return self.rng.choice(self.templates)

    def fresh(self, cls: type) -> msgspec.Struct:
        return self.value(mi.type_info(cls))

    # -- one message (a list of frames) --------------------------------------------------------
    def message(self) -> list[bytes]:
        r = self.rng
        roll = r.random()
        if roll < 0.10:
            return [r.randbytes(r.randrange(512))]
        if roll < 0.20:
            return [wire.MAGIC + bytes((PROTOCOL_VERSION, r.choice(sorted(MESSAGE_TYPES)))) + r.randbytes(r.randrange(256))]
        if roll < 0.33:
            frame = self.frame_of(self.valid())
            return [frame[:r.randrange(len(frame))]]
        if roll < 0.50:
            frame = bytearray(self.frame_of(self.valid()))
            for _ in range(r.randint(1, 4)):
                frame[r.randrange(len(frame))] ^= r.randint(1, 255)
            return [bytes(frame)]
        if roll < 0.65:
            return [self.wrong_field()]
        if roll < 0.70:
            frame = bytearray(self.frame_of(self.valid()))
            if len(frame) >= 4:
                frame[2 + r.randrange(2)] = r.randrange(256)   # version or kind
            return [bytes(frame)]
        if roll < 0.73:
            return [self.too_deep()]
        if roll < 0.735:
            return [self.oversized()]
        if roll < 0.85:
            return [f for _ in range(r.randint(2, 5)) for f in self.message()[:1]]
        if roll < 0.87:
            return [b""]
        return [self.frame_of(self.valid())]

    def wrong_field(self) -> bytes:
        msg = self.valid()
        body = msgspec.to_builtins(msg, builtin_types=(bytes,))
        fields = mi.type_info(type(msg)).fields
        if fields:
            body[self.rng.choice(fields).encode_name] = self.wrong_value()
        return self.frame_of(msg, body=msgspec.msgpack.encode(body))

    def too_deep(self) -> bytes:
        depth = self.rng.choice([100, 5_000, 100_000])
        body = msgspec.msgpack.encode({"health": {"w": DEEP}, "pool_id": DEEP})
        body = body.replace(msgspec.msgpack.encode(DEEP), b"\x91" * depth + b"\xc0")
        return self.frame_of(Heartbeat(), body=body)

    def oversized(self) -> bytes:
        # Over max_message_bytes, under the transport's limit: refused by the actor itself.
        frame = self.frame_of(self.valid())
        return frame + self.rng.randbytes(MAX_MESSAGE + self.rng.randrange(1000))


def wire_frame(msg: msgspec.Struct, body: bytes | None = None) -> bytes:
    if body is None:
        return bytes(wire.encode(msg)[0])
    return wire.MAGIC + bytes((PROTOCOL_VERSION, msg.KIND)) + body


def _never_registering(fuzz: FrameFuzzer) -> list[msgspec.Struct]:
    """A few valid messages of every kind; the Hellos are ones the scheduler refuses (a worker
    without credential, an unknown reasoner), so the fuzzing peers stay unregistered."""
    out = []
    for cls in MESSAGE_TYPES.values():
        for _ in range(3):
            msg = fuzz.fresh(cls)
            if isinstance(msg, Hello):
                msg.role = fuzz.rng.choice(["worker", "node", "reasoner", "admin"])
                msg.protocol_version = PROTOCOL_VERSION
            out.append(msg)
    return out


def fuzz_scheduler(address: str, seed: int) -> dict[str, int]:
    """FRAMES messages from 4 unregistered DEALER peers, answered one by one; then frames past the
    transport's limit, each from a peer of its own (which the transport disconnects)."""
    ctx = zmq.Context()
    fuzz = FrameFuzzer(seed, [], wire_frame)
    fuzz.templates = _never_registering(fuzz)
    peers = []
    for i in range(4):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, f"fuzz-{i}".encode())
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        peers.append(sock)
    counts = {"sent": 0, "undecodable": 0, "replies": 0, "error_replies": 0, "disconnecting": 0}
    try:
        while counts["sent"] < FRAMES:
            expected = {id(p): 0 for p in peers}
            for _ in range(min(200, FRAMES - counts["sent"])):
                peer = fuzz.rng.choice(peers)
                frames = fuzz.message()
                try:
                    wire.decode(frames, MAX_MESSAGE)
                except wire.WireError:
                    counts["undecodable"] += 1
                peer.send_multipart(frames)
                expected[id(peer)] += 1
                counts["sent"] += 1
            for peer in peers:
                for _ in range(expected[id(peer)]):
                    assert peer.poll(30_000), f"no reply after {counts['replies']} of {counts['sent']}"
                    reply = wire.decode(peer.recv_multipart(), 1 << 30)   # every reply is well formed
                    counts["replies"] += 1
                    counts["error_replies"] += type(reply) is ErrorReply
        for peer in peers:
            assert not peer.poll(200), "more replies than messages"
        for i in range(3):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(address)
            sock.send(wire_frame(Heartbeat()) + fuzz.rng.randbytes(TRANSPORT_LIMIT + 1 + i))
            assert not sock.poll(300)   # dropped with the connection: nothing comes back
            sock.close()
            counts["disconnecting"] += 1
    finally:
        for sock in peers:
            sock.close(0)
        ctx.term()
    return counts


def fuzz_push(address: str, seed: int, templates, socket_type: int, frame_of, fuzzer=FrameFuzzer,
              identities=(None,)) -> dict[str, int]:
    """FRAMES messages to a socket that answers nothing (the KV control channel, a node's notices);
    `undecodable`: how many of them wire.decode refuses (what a node must refuse)."""
    ctx = zmq.Context()
    fuzz = fuzzer(seed, [], frame_of)
    fuzz.templates = templates(fuzz)
    socks = []
    for identity in identities:
        sock = ctx.socket(socket_type)
        if identity is not None:
            sock.setsockopt(zmq.ROUTING_ID, identity)
        sock.setsockopt(zmq.LINGER, 5000)
        sock.setsockopt(zmq.SNDTIMEO, 30_000)
        sock.connect(address)
        socks.append(sock)
    counts = {"sent": 0, "undecodable": 0}
    try:
        for _ in range(FRAMES):
            sock = fuzz.rng.choice(socks)
            frames = fuzz.message()
            try:
                wire.decode(frames, MAX_MESSAGE)
            except wire.WireError:
                counts["undecodable"] += 1
            sock.send_multipart(frames)
            counts["sent"] += 1
            if socket_type == zmq.DEALER:
                while sock.poll(0):      # resize requests the steward sends our "pools"
                    sock.recv_multipart()
    finally:
        for sock in socks:
            sock.close()
        ctx.term()
    return counts


class KvFuzzer(FrameFuzzer):
    """Messages of the control channel, framed and mutated as FrameFuzzer does; some in the
    channel's former [b"stats" | b"resize", body] shape, which is dropped like any bad frame."""

    def message(self) -> list[bytes]:
        r = self.rng
        frames = super().message()
        if r.random() < 0.2:
            return [r.choice([b"stats", b"resize", b"", b"STATS"]), *frames]
        return frames


def kv_templates(fuzz: FrameFuzzer) -> list[msgspec.Struct]:
    return [fuzz.fresh(KvPoolStats) for _ in range(20)] + [fuzz.fresh(KvPoolResize) for _ in range(5)]


def notice_templates(fuzz: FrameFuzzer) -> list[msgspec.Struct]:
    out = []
    for _ in range(10):
        out.append(WorkerReady(name=fuzz.rng.choice(["local0/cpu0", "local0/cpu9", ""]), pid=fuzz.rng.randrange(1, 2**22)))
        out.append(DeadNotice(name=fuzz.rng.choice(["local9/cpu0", "x"]), reason="fuzz"))
    return out + _never_registering(fuzz)[:40]


def _worker_pid(node_pid: int) -> int:
    for pid in descendants(node_pid):
        try:
            if b"specgen.runtime.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    raise AssertionError("no worker process under the node")


def _notices_address(worker_pid: int) -> str:
    environ = Path(f"/proc/{worker_pid}/environ").read_bytes().split(b"\0")
    raw = next(e for e in environ if e.startswith(CONFIG_ENV.encode() + b"="))
    return json.loads(raw.split(b"=", 1)[1])["node_notices"]


def _count(log: Path, text: str) -> int:
    return log.read_text(errors="replace").count(text)


@pytest.mark.timeout(420)   # about 20 s on the 2-core machine; several times that while it is busy
def test_fuzzing_every_socket_leaves_every_actor_up_honest_and_small(softmax_problem: str,
                                                                       softmax_candidate: str) -> None:
    settings = quick_eval_settings(max_message_bytes=MAX_MESSAGE)
    with LocalCluster(workers=1, settings=settings, kv_control=True) as cluster:
        client = cluster.client
        logs = cluster.tmp / "logs"
        node_pid = cluster.nodes[0].pid
        worker_pid = _worker_pid(node_pid)
        pids = {"scheduler": cluster.scheduler.pid, "node": node_pid, "worker": worker_pid}
        # Warm up: every actor has done its share of an evaluation before the baseline.
        assert client.evaluate(softmax_problem, softmax_candidate, stage="validate").correct
        client.stats()
        before = {name: rss_bytes(pid) for name, pid in pids.items()}
        timings: dict[str, float] = {}

        t0 = time.monotonic()
        sched = fuzz_scheduler(cluster.address, seed=1)
        timings["scheduler"] = time.monotonic() - t0
        assert sched["sent"] == sched["replies"] == FRAMES
        assert sched["error_replies"] >= sched["undecodable"] > FRAMES // 2
        # Each refusal was the scheduler's own (logged), none took it down.
        assert _count(logs / "scheduler.log", "refused a message") >= sched["undecodable"]

        t0 = time.monotonic()
        assert cluster.kv_control_endpoint
        kv = fuzz_push(cluster.kv_control_endpoint, 2, kv_templates, zmq.DEALER, wire_frame, KvFuzzer,
                       identities=(b"fuzz-pool-a", b"\xff\xfe-not-text", None))
        timings["kv_control"] = time.monotonic() - t0
        honest_pool = PoolControlClient(cluster.kv_control_endpoint, "honest-pool")
        try:
            honest_pool.send_stats(KvPoolStats(pool_id="honest-pool", capacity_bytes=123, host="fuzz-host"))
            wait_for(lambda: any(v.pool == "honest-pool" and v.stats.capacity_bytes == 123
                                 for v in client.stats().kv_pools), 30, "the honest pool's stats")
        finally:
            honest_pool.close()

        t0 = time.monotonic()
        node_log = logs / "node0.log"
        refused_before = _count(node_log, "bad notice from a worker")
        notices = fuzz_push(_notices_address(worker_pid), 3, notice_templates, zmq.PUSH, wire_frame)
        # The node reads them on its own thread: wait until it has refused every one that cannot decode.
        undecodable = notices["undecodable"]
        wait_for(lambda: _count(node_log, "bad notice from a worker") - refused_before >= undecodable, 120,
                 f"the node to refuse {undecodable} notices", interval=0.5)
        timings["node_notices"] = time.monotonic() - t0

        # Everyone is up and honest requests still work, end to end.
        for name, pid in pids.items():
            assert Path(f"/proc/{pid}").exists(), f"{name} died"
        assert cluster.scheduler.alive() and cluster.nodes[0].alive()
        client.ping(b"still there")
        stats = client.stats()
        assert [w.name for w in stats.workers] == ["local0/cpu0"] and stats.workers[0].pid == worker_pid
        assert stats.node_health["local0"]["local0/cpu0"]["state"] == "ready"
        verdict = client.evaluate(softmax_problem, softmax_candidate, stage="validate")
        assert verdict.correct, verdict.error
        after = {name: rss_bytes(pid) for name, pid in pids.items()}
        growth = {name: after[name] - before[name] for name in pids}
        print(f"fuzz: scheduler {sched}, kv {kv}, notices {notices} ; "
              f"seconds {({k: round(v, 1) for k, v in timings.items()})}; RSS growth MiB "
              f"{({k: round(v / 2**20, 1) for k, v in growth.items()})}; RSS after MiB "
              f"{({k: round(v / 2**20, 1) for k, v in after.items()})}")
        assert kv["sent"] == notices["sent"] == FRAMES
        for name, grown in growth.items():
            assert grown < RSS_GROWTH_LIMIT, f"{name} grew by {grown / 2**20:.1f} MiB"
