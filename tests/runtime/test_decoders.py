"""Every decoder of bytes that come from another process, fed what a broken or hostile peer sends.

Arbitrary bytes, truncated valid encodings, valid encodings with a field of the wrong type,
oversized payloads and arrays nested past the decoder's depth limit. The property, for each: it
returns a message of the expected type or raises the module's own error, which names what is
wrong (wire: `WireError` with a code and the field; runner channels: `FrameError`), never anything
else and never waits past its deadline. Where the decoding sits inside a receive loop (the KV
control channel, the scheduler's sockets, a node's notices, a peer connection), the loop itself is
driven with such frames and must neither raise nor lose the honest message that follows.

Valid messages are generated from the structs' own type information (`msgspec.inspect`), so a
message type added later is covered without touching this file.
"""
from __future__ import annotations

import os
import threading
import time
import types
import typing
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specgen.eval import protocol
from specgen.kv import pool_control
from specgen.kv.pool_control import KvPoolController, PoolControlClient
from specgen.messages import (
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    BuildResult,
    ErrorReply,
    KvPoolResize,
    KvPoolStats,
    Ping,
    RefTiming,
    RunnerReply,
    RunnerRequest,
    Verdict,
)
from specgen.runtime import wire
from specgen.runtime.node import NodeActor
from specgen.runtime.scheduler import SchedulerActor
from specgen.runtime.settings import RuntimeSettings
from specgen.runtime.socket_io import recv_frame
from specgen.runtime.transport import PeerConnection

QUICK = settings(max_examples=30, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
WIRE_CODES = {"malformed", "version", "unknown_kind", "too_large"}
KINDS = sorted(MESSAGE_TYPES)
LIMIT = 1 << 20

# -- values of every type a message field can have ---------------------------------------------

_LEAF = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False)
         | st.text(max_size=12) | st.binary(max_size=12))
ANY = st.recursive(_LEAF, lambda inner: st.lists(inner, max_size=3)
                   | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


def strategy_for(t: mi.Type) -> st.SearchStrategy:
    """Valid values of the msgspec type `t` (as msgspec.inspect describes it)."""
    if isinstance(t, mi.StructType):
        required = {f.name: strategy_for(f.type) for f in t.fields if f.required}
        optional = {f.name: strategy_for(f.type) for f in t.fields if not f.required}
        return st.fixed_dictionaries(required, optional=optional).map(lambda kw: t.cls(**kw))
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.StrType):
        return st.text(max_size=20)
    if isinstance(t, mi.IntType):
        return st.integers(-2**63, 2**63 - 1)
    if isinstance(t, mi.FloatType):
        return st.floats(allow_nan=False)
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.BytesType):
        return st.binary(max_size=40)
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.UnionType):
        return st.one_of([strategy_for(x) for x in t.types])
    if isinstance(t, mi.ListType):
        return st.lists(strategy_for(t.item_type), max_size=3)
    if isinstance(t, mi.DictType):
        return st.dictionaries(strategy_for(t.key_type), strategy_for(t.value_type), max_size=3)
    if isinstance(t, mi.AnyType):
        return ANY
    raise AssertionError(f"no strategy for {t!r}: add one (a message field of a new type)")


def messages(cls: type) -> st.SearchStrategy:
    return strategy_for(mi.type_info(cls))


def header(kind: int, version: int = PROTOCOL_VERSION) -> bytes:
    return wire.MAGIC + bytes((version, kind))


def check_wire(frames: list[bytes], max_bytes: int = LIMIT) -> object:
    """wire.decode's contract: a message of the kind the header says, or a WireError that says why."""
    try:
        msg = wire.decode(frames, max_bytes)
    except wire.WireError as exc:
        assert exc.code in WIRE_CODES and exc.message, (exc.code, exc.message)
        assert isinstance(exc.ref, int)
        reply = exc.reply()
        assert wire.decode(wire.encode(reply), LIMIT) == reply   # the error goes back whole
        return exc
    assert len(frames) == 1 and type(msg) is MESSAGE_TYPES[frames[0][3]]
    return msg


# -- wire.py: every message kind -------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS, ids=lambda k: MESSAGE_TYPES[k].__name__)
@QUICK
@given(data=st.data())
def test_valid_messages_round_trip_and_truncations_are_refused(kind: int, data: st.DataObject) -> None:
    msg = data.draw(messages(MESSAGE_TYPES[kind]))
    frame = bytes(wire.encode(msg)[0])
    assert wire.decode([frame], LIMIT) == msg
    cut = data.draw(st.integers(0, len(frame) - 1))
    exc = check_wire([frame[:cut]])
    assert isinstance(exc, wire.WireError) and exc.code == "malformed"


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: MESSAGE_TYPES[k].__name__)
@QUICK
@given(data=st.data())
def test_a_field_of_the_wrong_type_is_refused_by_name(kind: int, data: st.DataObject) -> None:
    cls = MESSAGE_TYPES[kind]
    msg = data.draw(messages(cls))
    body = msgspec.to_builtins(msg, builtin_types=(bytes,))
    fields = [f for f in mi.type_info(cls).fields]
    field = data.draw(st.sampled_from(fields))
    body[field.encode_name] = data.draw(ANY)
    result = check_wire([header(kind) + msgspec.msgpack.encode(body)])
    if isinstance(result, wire.WireError):
        assert result.code == "malformed" and f"$.{field.encode_name}" in result.message, result.message
        call_id = getattr(msg, "call_id", None)
        if call_id is not None and field.name != "call_id":
            assert result.ref == call_id   # the sender can tell which request was refused


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: MESSAGE_TYPES[k].__name__)
@QUICK
@given(body=st.binary(max_size=200) | ANY.map(msgspec.msgpack.encode))
def test_arbitrary_bodies_under_every_header(kind: int, body: bytes) -> None:
    check_wire([header(kind) + body])


@settings(max_examples=400, deadline=None, database=None)
@given(frames=st.lists(st.binary(max_size=64) | st.builds(lambda h, b: h + b, st.sampled_from(
    [header(k) for k in KINDS] + [header(200), header(Ping.KIND, PROTOCOL_VERSION + 1), b"SG"]),
    st.binary(max_size=64)), min_size=0, max_size=5))
def test_arbitrary_bytes_and_frame_counts(frames: list[bytes]) -> None:
    result = check_wire(frames)
    if len(frames) != 1:
        assert isinstance(result, wire.WireError) and result.code == "malformed"


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: MESSAGE_TYPES[k].__name__)
@settings(max_examples=15, deadline=None, database=None)
@given(data=st.data())
def test_oversized_messages_are_refused_with_their_call_id(kind: int, data: st.DataObject) -> None:
    msg = data.draw(messages(MESSAGE_TYPES[kind]))
    frame = bytes(wire.encode(msg)[0])
    limit = data.draw(st.integers(0, len(frame) - 1))
    exc = check_wire([frame], limit)
    assert isinstance(exc, wire.WireError) and exc.code == "too_large"
    assert exc.ref == getattr(msg, "call_id", 0)
    # Several frames together over the limit: too large as well, before anything is read.
    assert check_wire([frame, frame], limit).code == "too_large"


def test_a_large_payload_within_the_limit_is_accepted_and_one_byte_over_is_not() -> None:
    msg = Ping(call_id=7, payload=os.urandom(LIMIT - 64))
    frame = bytes(wire.encode(msg)[0])
    assert wire.decode([frame], len(frame)) == msg
    exc = check_wire([frame], len(frame) - 1)
    assert exc.code == "too_large" and exc.ref == 7 and str(len(frame)) in exc.message


DEEP = "\x00deep\x00"


def _any_paths(t: mi.Type, path: tuple = ()) -> list[tuple]:
    """Paths (field names) to every field typed Any, or dict/list of Any, inside struct type `t`."""
    found = []
    if isinstance(t, mi.StructType):
        for f in t.fields:
            found += _any_paths(f.type, path + (f.encode_name,))
    elif isinstance(t, mi.UnionType):
        for x in t.types:
            found += _any_paths(x, path)
    elif isinstance(t, (mi.DictType, mi.ListType)):
        inner = t.value_type if isinstance(t, mi.DictType) else t.item_type
        if isinstance(inner, mi.AnyType):
            found.append(path)
        else:
            found += _any_paths(inner, path)
    return found


_DEEP_CASES = [(kind, path) for kind in KINDS for path in _any_paths(mi.type_info(MESSAGE_TYPES[kind]))]


@pytest.mark.parametrize("kind, path", _DEEP_CASES,
                         ids=[f"{MESSAGE_TYPES[k].__name__}.{'.'.join(p)}" for k, p in _DEEP_CASES])
@pytest.mark.parametrize("depth", [50, 5_000, 200_000])
def test_arrays_nested_past_the_depth_limit_in_an_any_field(kind: int, path: tuple, depth: int) -> None:
    """A small frame of nested arrays once raised RecursionError out of the scheduler's receive
    loop (it caught only WireError), which took the scheduler down."""
    cls = MESSAGE_TYPES[kind]
    body = msgspec.to_builtins(_minimal(cls), builtin_types=(bytes,))
    where = body
    for name in path[:-1]:
        if where.get(name) is None:   # an optional struct left out: present, with only this in it
            where[name] = {}
        where = where[name]
    where[path[-1]] = {"k": DEEP} if _is_dict(cls, path) else [DEEP]
    encoded = msgspec.msgpack.encode(body).replace(msgspec.msgpack.encode(DEEP), b"\x91" * depth + b"\xc0")
    result = check_wire([header(kind) + encoded])
    if depth > 10_000:
        assert isinstance(result, wire.WireError) and "nested too deeply" in result.message


def _is_dict(cls: type, path: tuple) -> bool:
    t: Any = mi.type_info(cls)
    for name in path:
        if isinstance(t, mi.UnionType):
            t = next(x for x in t.types if isinstance(x, mi.StructType))
        t = next(f.type for f in t.fields if f.encode_name == name)
    if isinstance(t, mi.UnionType):
        t = next(x for x in t.types if not isinstance(x, mi.NoneType))
    return isinstance(t, mi.DictType)


def _minimal(cls: type) -> object:
    """The smallest valid instance: required fields only, each its type's simplest value."""
    def simplest(t: mi.Type) -> object:
        if isinstance(t, mi.StructType):
            return t.cls(**{f.name: simplest(f.type) for f in t.fields if f.required})
        if isinstance(t, mi.UnionType):
            return simplest(t.types[0])
        if isinstance(t, mi.LiteralType):
            return t.values[0]
        return {mi.StrType: "", mi.IntType: 0, mi.FloatType: 0.0, mi.BoolType: False, mi.BytesType: b"",
                mi.NoneType: None, mi.ListType: [], mi.DictType: {}, mi.AnyType: None}[type(t)]
    return simplest(mi.type_info(cls))


def nested(body: dict, depth: int, key: str = "zz") -> bytes:
    """`body` as msgpack with `key` holding arrays nested `depth` deep (an unknown field unless
    `key` is one of the struct's: skipping it recurses as much as reading it)."""
    return msgspec.msgpack.encode({**body, key: DEEP}).replace(
        msgspec.msgpack.encode(DEEP), b"\x91" * depth + b"\xc0")


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: MESSAGE_TYPES[k].__name__)
def test_an_unknown_field_nested_past_the_depth_limit(kind: int) -> None:
    body = msgspec.to_builtins(_minimal(MESSAGE_TYPES[kind]), builtin_types=(bytes,))
    result = check_wire([header(kind) + nested(body, 100_000)])
    assert isinstance(result, wire.WireError) and "nested too deeply" in result.message
    assert type(check_wire([header(kind) + nested(body, 20)])) is MESSAGE_TYPES[kind]


# -- eval/protocol.py: the runner channels -------------------------------------------------

REPLY_KINDS = list(typing.get_args(RunnerReply))
REQUEST_KINDS = list(typing.get_args(RunnerRequest))


def _packets(kinds: list[type]) -> st.SearchStrategy:
    """What a hostile runner (or judge) can put on its end of the socket: packets of any kind,
    valid messages cut into packets at random, bad headers, wrong fields, deep nesting."""
    valid = st.sampled_from(kinds).flatmap(messages).map(msgspec.msgpack.encode)
    wrong = st.sampled_from(kinds).flatmap(_wrong_field)
    body = (valid | wrong | st.binary(max_size=200)
            | st.sampled_from([20, 5_000, 50_000]).map(lambda d: msgspec.msgpack.encode(nested({}, d))))

    def cut(data: bytes, at: int) -> list[bytes]:
        at = max(1, min(at, len(data)))
        pieces = [data[i:i + at] for i in range(0, len(data), at)] or [b""]
        return [protocol._MORE + p for p in pieces[:-1]] + [protocol._LAST + pieces[-1]]

    message = st.tuples(body, st.integers(64, protocol.PACKET)).map(lambda bc: cut(*bc))
    raw = st.binary(min_size=1, max_size=100).map(lambda b: [b])
    return st.lists(message | raw, max_size=4).map(lambda groups: [p for g in groups for p in g])


@st.composite
def _wrong_field(draw: Any, kind: type) -> bytes:
    body = msgspec.to_builtins(draw(messages(kind)), builtin_types=(bytes,))
    fields = [f.encode_name for f in mi.type_info(kind).fields]
    if fields:
        body[draw(st.sampled_from(fields))] = draw(ANY)
    return msgspec.msgpack.encode(body)


@pytest.mark.parametrize("role,kinds", [("judge", REPLY_KINDS), ("runner", REQUEST_KINDS)])
@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_channel_returns_its_messages_or_frame_errors_and_never_waits_past_a_close(
        role: str, kinds: list[type], data: st.DataObject) -> None:
    packets = data.draw(_packets(kinds))
    ours, theirs = protocol.socket_pair()
    channel = protocol.Channel(ours, role)

    def write() -> None:   # from a thread: more than the socket holds
        try:
            for packet in packets:
                theirs.send(packet)
        except OSError:
            pass           # the channel stopped early (a FrameError) and closed its end
        finally:
            theirs.close()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        started = time.monotonic()
        for _ in range(len(packets) + 2):   # a message per packet at most, then the close
            try:
                received = channel.recv(time.monotonic() + 5.0)
            except protocol.FrameError as exc:
                assert str(exc), exc
                break
            except protocol.ChannelClosed:
                break
            assert received is not None, "a closed end must not read as a timeout"
            assert type(received.message) in kinds
        else:
            raise AssertionError("more messages than packets")
        assert time.monotonic() - started < 5.0
    finally:
        channel.close()
        writer.join()


def test_a_packet_longer_than_the_channels_is_refused_not_cut() -> None:
    ours, theirs = protocol.socket_pair()
    channel = protocol.Channel(ours, "judge")
    try:
        theirs.send(protocol._LAST + b"\x80" * (protocol.PACKET + 100))
        with pytest.raises(protocol.FrameError, match="longer than"):
            channel.recv(time.monotonic() + 5)
    finally:
        channel.close()
        theirs.close()


# -- kv/pool_control.py and the scheduler's KV decoder ---------------------------------------

def _wire_frame(msg: msgspec.Struct) -> bytes:
    return bytes(wire.encode(msg)[0])


_KV_MESSAGES = messages(KvPoolStats) | messages(KvPoolResize)
_KV_BODIES = (_KV_MESSAGES.map(_wire_frame)
              | st.sampled_from(KINDS).flatmap(lambda k: messages(MESSAGE_TYPES[k])).map(_wire_frame)
              | _KV_MESSAGES.map(msgspec.msgpack.encode)                       # a body without its header
              | st.tuples(st.sampled_from([KvPoolStats.KIND, KvPoolResize.KIND]), st.integers(20, 50_000))
                .map(lambda kd: header(kd[0]) + nested({}, kd[1]))
              | st.binary(max_size=100) | ANY.map(msgspec.msgpack.encode))
# The channel's old [b"stats" | b"resize", body] messages are among what must be dropped.
_KV_FRAMES = st.lists(st.sampled_from([b"stats", b"resize", b"", b"SG"]) | _KV_BODIES, min_size=1, max_size=4)


@settings(max_examples=200, deadline=None, database=None)
@given(frame=_KV_BODIES)
def test_kv_read_frame_returns_its_type_or_nothing(frame: bytes) -> None:
    # The pool side and the controller read with read_frame, the scheduler's _receive_kv with
    # wire.decode (covered above for every kind): nothing but the expected type gets through.
    for cls in (KvPoolStats, KvPoolResize):
        msg = pool_control.read_frame(frame, cls)
        assert msg is None or type(msg) is cls
        try:
            decoded = wire.decode_frame(frame, pool_control.MAX_MESSAGE_BYTES)
        except wire.WireError:
            assert msg is None
        else:
            assert (msg is not None) == (type(decoded) is cls)


def test_pool_controller_skips_garbage_and_still_takes_honest_stats() -> None:
    controller = KvPoolController("inproc://decoders-pool-controller")
    ctx = zmq.Context.instance()
    raw: dict[bytes, zmq.Socket] = {}
    honest = PoolControlClient(controller.endpoint, "honest")
    try:
        @settings(max_examples=150, deadline=None, database=None)
        @given(identity=st.sampled_from([b"\xff\xfe-not-text", b"pool-a", b"x"]), batch=st.lists(_KV_FRAMES, max_size=5),
               seq=st.integers(0, 2**31))
        def check(identity: bytes, batch: list[list[bytes]], seq: int) -> None:
            sock = raw.get(identity)
            if sock is None:
                sock = raw[identity] = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.ROUTING_ID, identity)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(controller.endpoint)
            for frames in batch:
                sock.send_multipart(frames)
            honest.send_stats(KvPoolStats(pool_id="honest", hits=seq))
            deadline = time.monotonic() + 5
            while True:
                got = controller.receive(0.5)
                for pool, stats in got:
                    assert isinstance(pool, str) and type(stats) is KvPoolStats
                if any(pool == "honest" and stats.hits == seq for pool, stats in got):
                    return
                assert time.monotonic() < deadline, "the honest stats never arrived"

        check()
    finally:
        for sock in raw.values():
            sock.close(0)
        honest.close()
        controller.close()


def test_pool_client_skips_garbage_and_still_takes_an_honest_resize() -> None:
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.bind("inproc://decoders-pool-client")
    client = PoolControlClient("inproc://decoders-pool-client", "pool-x")
    try:
        client.send_stats(KvPoolStats(pool_id="pool-x"))
        assert router.poll(5000) and router.recv_multipart()[0] == b"pool-x"

        @settings(max_examples=150, deadline=None, database=None)
        @given(batch=st.lists(_KV_FRAMES, max_size=5), seq=st.integers(0, 2**31))
        def check(batch: list[list[bytes]], seq: int) -> None:
            for frames in batch:
                router.send_multipart([b"pool-x", *frames])
            router.send_multipart([b"pool-x", *wire.encode(KvPoolResize(request_id=str(seq)))])
            deadline = time.monotonic() + 5
            while True:
                got = client.poll_resize()
                assert all(type(r) is KvPoolResize for r in got)
                if any(r.request_id == str(seq) for r in got):
                    return
                assert time.monotonic() < deadline, "the honest resize never arrived"
                time.sleep(0.001)

        check()
    finally:
        client.close()
        router.close(0)


# -- the actors' receive paths, in process ---------------------------------------------------

def _mutated_frames() -> st.SearchStrategy:
    kinds = st.sampled_from(KINDS)
    valid = kinds.flatmap(lambda k: messages(MESSAGE_TYPES[k])).map(lambda m: bytes(wire.encode(m)[0]))
    flipped = _flip(valid)
    one = (valid | flipped | st.tuples(valid, st.integers(0, 40)).map(lambda vc: vc[0][:vc[1]])
           | st.builds(lambda k, b: header(k) + b, kinds, st.binary(max_size=80)) | st.binary(max_size=80))
    return st.lists(one, min_size=1, max_size=3)


@st.composite
def _flip(draw: Any, frames: st.SearchStrategy) -> bytes:
    out = bytearray(draw(frames))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(out) - 1))
        out[i] ^= draw(st.integers(1, 255))
    return bytes(out)


def test_scheduler_receive_paths_answer_or_drop_every_frame(tmp_path: Path) -> None:
    """The scheduler's own _receive (with its real core) and _receive_kv, fed mutated frames from
    a peer that never registered: each message gets exactly one reply, an ErrorReply for every
    one that does not decode, and nothing escapes the loop."""
    settings_ = RuntimeSettings(max_message_bytes=4096, kv_control_bind="inproc://decoders-kv")
    actor = SchedulerActor("inproc://decoders-scheduler", tmp_path, settings_)
    actor.sock.setsockopt(zmq.RCVTIMEO, 2000)
    peer = actor.ctx.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.setsockopt(zmq.RCVTIMEO, 2000)
    peer.connect(actor.address)
    pool = actor.ctx.socket(zmq.DEALER)
    pool.setsockopt(zmq.LINGER, 0)
    pool.connect(actor.kv_address)
    try:
        @settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
        @given(batch=st.lists(_mutated_frames(), min_size=1, max_size=6), kv=st.lists(_KV_FRAMES, max_size=4))
        def check(batch: list[list[bytes]], kv: list[list[bytes]]) -> None:
            undecodable = 0
            for frames in batch:
                try:
                    wire.decode(frames, settings_.max_message_bytes)
                except wire.WireError:
                    undecodable += 1
                peer.send_multipart(frames)
            for frames in kv:
                pool.send_multipart(frames)
            errors = replies = 0
            deadline = time.monotonic() + 10
            while replies < len(batch) and time.monotonic() < deadline:
                if actor.sock.poll(0):
                    actor._receive(time.monotonic(), recv_frame(actor.sock, 0), batch=True)
                    actor._flush()
                elif peer.poll(1):
                    reply = wire.decode(peer.recv_multipart(), 1 << 30)
                    errors += type(reply) is ErrorReply
                    replies += 1
            actor._receive_kv(time.monotonic())
            assert not peer.poll(1) and not actor.sock.poll(0)
            # Unregistered, the peer gets one reply per message: an ErrorReply for each that does
            # not decode (and an ErrorReply "unregistered", or a Hello's answer, for the others).
            assert errors >= undecodable and replies == len(batch), (errors, undecodable, replies)
            # A mutated frame can still be a Hello the core accepts: the next example starts from
            # a peer that never registered again (a registered peer's Goodbye gets no reply).
            for known in list(actor.core.registry.peers):
                actor.core.registry.lose(known, "reset between examples", time.monotonic())

        check()
    finally:
        peer.close(0)
        pool.close(0)
        actor.close()


def test_node_notice_handler_drops_what_does_not_decode() -> None:
    items: list = []
    node = types.SimpleNamespace(settings=RuntimeSettings(max_message_bytes=4096),
                                 inbox=types.SimpleNamespace(put=items.append))

    @settings(max_examples=150, deadline=None, database=None)
    @given(frames=_mutated_frames())
    def check(frames: list[bytes]) -> None:
        items.clear()
        NodeActor._on_notice(node, frames)  # type: ignore[arg-type]
        decoded = not isinstance(check_wire(frames, 4096), wire.WireError)
        assert len(items) == int(decoded)

    check()


def test_peer_connection_frame_handler_survives_any_frame_from_the_scheduler() -> None:
    conn = PeerConnection("inproc://decoders-nowhere", "client", "fuzz", RuntimeSettings(max_message_bytes=4096))
    try:
        @settings(max_examples=150, deadline=None, database=None)
        @given(frames=_mutated_frames())
        def check(frames: list[bytes]) -> None:
            for frame in frames:
                conn._on_frame(frame)

        check()
    finally:
        conn.close()


# -- other bytes from other processes: replay directives, the runners' cache files ----------

@settings(max_examples=200, deadline=None, database=None)
@given(rest=st.text(max_size=80) | ANY.map(lambda v: msgspec.json.encode(v).decode(errors="replace"))
       | st.sampled_from([20, 5_000, 50_000]).map(lambda d: '{"validate_s": 1, "zz": ' + "[" * d + "]" * d + "}"))
def test_replay_directives_decode_or_raise_a_value_error_that_says_so(rest: str) -> None:
    from specgen.messages import CandidateSubmission
    from specgen.runtime.replay_evaluator import DIRECTIVE, ReplayEvaluator, ReplaySample

    sub = CandidateSubmission(job_id="j", candidate_id="c", problem_name="p", problem_source="",
                              candidate_source=f"{DIRECTIVE} {rest}\n")
    try:
        assert type(ReplayEvaluator().plan(sub)) is ReplaySample
    except ValueError as exc:
        assert "replay directive" in str(exc)


@settings(max_examples=200, deadline=None, database=None)
@given(content=st.binary(max_size=120) | ANY.map(msgspec.json.encode)
       | messages(RefTiming).map(msgspec.json.encode)
       | st.sampled_from([20, 5_000, 50_000]).map(lambda d: b'{"ref_ms": 1, "ref_spread": 0, "zz": '
                                                  + b"[" * d + b"]" * d + b"}"))
def test_cache_files_written_by_runners_read_back_or_count_as_missing(tmp_path_factory, content: bytes) -> None:
    from specgen.eval.builds import _read_marker
    from specgen.eval.evaluator import RefTimingCache

    root = tmp_path_factory.mktemp("cache", numbered=True)
    cache = RefTimingCache(root)
    (cache.root / "k.json").write_bytes(content)
    got = cache.get("k")
    assert got is None or type(got) is RefTiming
    (root / "marker.json").write_bytes(content)
    marker = _read_marker(root / "marker.json")
    assert marker is None or type(marker) is BuildResult
