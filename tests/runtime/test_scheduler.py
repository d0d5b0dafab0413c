"""The scheduler process with real sockets: bad input, authentication, shutdown."""
from __future__ import annotations

import signal
from pathlib import Path

import msgspec
import pytest
import zmq

from specgen.cli import main as cli_main
from specgen.messages import PROTOCOL_VERSION, ErrorReply, Hello, Ping, Pong, SubmitCandidate, Welcome
from specgen.runtime import wire
from specgen.runtime.auth import ClientKeys, generate, load_client_keys
from specgen.runtime.child_process import ChildProcess
from specgen.runtime.client import Client
from specgen.runtime.settings import SETTINGS_ENV, RuntimeSettings
from specgen.runtime.transport import AuthenticationFailed, SchedulerUnreachable

from tests.runtime.conftest import wait_for


def start_scheduler(tmp_path: Path, settings: RuntimeSettings, bind: str | None = None,
                    keys: Path | None = None) -> tuple[str, ChildProcess]:
    state = tmp_path / "state"
    args = ["--bind", bind or f"ipc://{tmp_path}/s.sock", "--state-dir", str(state)]
    if keys is not None:
        args += ["--keys", str(keys)]
    child = ChildProcess("scheduler", "specgen.runtime.scheduler", args,
                         env={SETTINGS_ENV: settings.to_env()}, log_path=tmp_path / "scheduler.log").start()
    address = wait_for(lambda: (state / "address").exists() and (state / "address").read_text().strip(),
                       30, "the scheduler to listen")
    return str(address), child


@pytest.fixture
def small_limit_scheduler(tmp_path: Path):
    settings = RuntimeSettings(max_message_bytes=64 * 1024)
    address, child = start_scheduler(tmp_path, settings)
    yield address, child
    child.stop(5)


def raw_socket(ctx: zmq.Context, address: str) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return sock


def reply(sock: zmq.Socket):
    return wire.decode(sock.recv_multipart(), 1 << 30)


def test_bad_frames_get_clear_errors_and_the_scheduler_keeps_serving(small_limit_scheduler) -> None:
    address, child = small_limit_scheduler
    ctx = zmq.Context()
    try:
        sock = raw_socket(ctx, address)
        cases = [
            ([b"just one frame"], "malformed"),
            ([b"HTTP/1.1", b"GET /"], "malformed"),
            ([b"SG" + bytes((PROTOCOL_VERSION + 1, Ping.KIND)) + msgspec.msgpack.encode({"call_id": 5})], "version"),
            ([b"SG" + bytes((PROTOCOL_VERSION, 200)) + msgspec.msgpack.encode({"call_id": 6})], "unknown_kind"),
            ([b"SG" + bytes((PROTOCOL_VERSION, SubmitCandidate.KIND))
              + msgspec.msgpack.encode({"call_id": 7, "submission": "not a submission"})], "malformed"),
            (wire.encode(Ping(call_id=8, payload=b"x" * 100_000)), "too_large"),
            (wire.encode(Ping(call_id=9)), "unregistered"),        # no Hello yet
        ]
        for frames, code in cases:
            sock.send_multipart(frames)
            err = reply(sock)
            assert isinstance(err, ErrorReply) and err.code == code, (frames[:1], err)
            assert err.message
        assert [c for c in cases if c[1] == "version"]
        # Errors carry the request's call id when it could be read.
        sock.send_multipart(wire.encode(Ping(call_id=31, payload=b"y" * 100_000)))
        assert reply(sock).ref == 31
        # Past the transport's hard limit the connection is cut (no reply is possible)...
        sock.send_multipart(wire.encode(Ping(call_id=10, payload=b"z" * 1_000_000)))
        # ...and the scheduler still serves everyone, this peer included once it reconnects.
        other = raw_socket(ctx, address)
        other.send_multipart(wire.encode(Hello(role="client", name="other")))
        assert isinstance(reply(other), Welcome)
        other.send_multipart(wire.encode(Ping(call_id=11, payload=b"ok")))
        pong = reply(other)
        assert isinstance(pong, Pong) and pong.payload == b"ok"
        assert child.alive()
    finally:
        ctx.destroy(linger=0)


def test_client_refuses_oversized_requests_locally(small_limit_scheduler) -> None:
    address, _ = small_limit_scheduler
    with Client(address, settings=RuntimeSettings(max_message_bytes=64 * 1024)) as client:
        with pytest.raises(Exception, match="max_message_bytes"):
            client.evaluate("class Model: pass\n" + "#" * 100_000, "x")
        assert client.ping() < 5


def test_curve_keys_admit_authorized_clients_only(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    generate(keys, clients=1)
    address, child = start_scheduler(tmp_path, RuntimeSettings(), bind="tcp://127.0.0.1:*", keys=keys)
    try:
        with Client(address, keys=keys) as client:
            assert client.ping() < 5
        stranger_public, stranger_secret = zmq.curve_keypair()
        good = load_client_keys(keys)
        stranger = ClientKeys(server_public=good.server_public, public=stranger_public, secret=stranger_secret)
        with pytest.raises(AuthenticationFailed, match="refused this peer's CURVE key"):
            Client(address, keys=stranger, connect_timeout_s=10)
        with pytest.raises(SchedulerUnreachable, match="connect_timeout_s"):
            Client(address, connect_timeout_s=1.5)     # no keys at all
        with Client(address, keys=keys) as client:    # still serving
            assert client.ping() < 5
    finally:
        child.stop(5)


def test_listening_off_loopback_requires_keys(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = cli_main(["serve", "--bind", "tcp://0.0.0.0:*", "--state-dir", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "not a loopback address" in err and "specgen keys generate" in err


def test_keys_command_writes_a_usable_key_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli_main(["keys", "generate", str(tmp_path / "k"), "--clients", "2"]) == 0
    names = sorted(p.name for p in (tmp_path / "k").iterdir())
    assert {"server.key", "server.key_secret", "client.key_secret", "client1.key_secret", "authorized"} <= set(names)
    assert len(list((tmp_path / "k" / "authorized").iterdir())) == 2
    assert cli_main(["keys", "generate", str(tmp_path / "k")]) == 2   # never overwrites


def test_sigterm_stops_the_scheduler_cleanly(tmp_path: Path) -> None:
    address, child = start_scheduler(tmp_path, RuntimeSettings())
    with Client(address) as client:
        client.ping()
    child.signal(signal.SIGTERM)
    assert child.proc.wait(10) == 0
