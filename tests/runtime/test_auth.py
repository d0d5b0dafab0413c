from pathlib import Path

import pytest

from specgen.errors import UsageError
from specgen.runtime.auth import (
    client_keys_from_env, client_keys_to_env, ephemeral_client_keys, generate, is_loopback,
    load_client_keys, load_server_keys, require_keys_for,
)


@pytest.mark.parametrize("address, local", [
    ("ipc:///tmp/x.sock", True), ("inproc://x", True), ("tcp://127.0.0.1:5555", True),
    ("tcp://localhost:5555", True), ("tcp://[::1]:5555", True), ("tcp://127.0.0.1:*", True),
    ("tcp://0.0.0.0:5555", False), ("tcp://*:5555", False), ("tcp://10.1.2.3:5555", False),
])
def test_loopback_detection(address: str, local: bool) -> None:
    assert is_loopback(address) is local


def test_unknown_scheme_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="tcp://, ipc://"):
        is_loopback("http://x")


def test_keys_round_trip_and_authorization(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    generate(tmp_path, clients=2)
    server = load_server_keys(tmp_path)
    client = load_client_keys(tmp_path)
    second = load_client_keys(tmp_path, "client1")
    assert client.server_public == server.public
    assert {client.public, second.public} == server.authorized
    eph = ephemeral_client_keys(server)
    assert eph.public in server.authorized
    for key, value in client_keys_to_env(eph).items():
        monkeypatch.setenv(key, value)
    assert client_keys_from_env() == eph
    with pytest.raises(UsageError, match="not found"):
        load_client_keys(tmp_path, "nobody")
    require_keys_for("tcp://10.0.0.1:1", client)
    with pytest.raises(UsageError, match="specgen keys generate"):
        require_keys_for("tcp://10.0.0.1:1", None)
