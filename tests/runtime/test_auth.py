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


def test_join_secret_file_is_made_private_once_and_read_back(tmp_path: Path) -> None:
    from specgen.runtime.auth import load_join_secret

    path = tmp_path / "state" / "join_secret"
    secret = load_join_secret(path, create=True)
    assert len(secret) == 32 and (path.stat().st_mode & 0o777) == 0o600
    assert load_join_secret(path, create=True) == secret == load_join_secret(path)
    with pytest.raises(UsageError, match="not found"):
        load_join_secret(tmp_path / "missing")
    (tmp_path / "short").write_text("abcd\n")
    with pytest.raises(UsageError, match="at least 16 bytes"):
        load_join_secret(tmp_path / "short")


def test_credentials_admit_one_name_in_one_role_only() -> None:
    from specgen.runtime.auth import check_credential, new_join_secret, peer_credential

    secret = new_join_secret()
    cred = peer_credential(secret, "worker", "n1/cpu0", "n1")
    assert check_credential(secret, "worker", "n1/cpu0", "n1", cred)
    assert secret.hex() not in cred
    for role, name, node in (("worker", "n1/cpu1", "n1"), ("worker", "n1/cpu0", "n2"),
                             ("node", "n1/cpu0", "n1"), ("reasoner", "n1/cpu0", "")):
        assert not check_credential(secret, role, name, node, cred)
    assert not check_credential(new_join_secret(), "worker", "n1/cpu0", "n1", cred)
    assert not check_credential(secret, "worker", "n1/cpu0", "n1", "")
    assert not check_credential(secret, "worker", "n1/cpu0", "n1", "ü" * 64)   # no TypeError


def test_curve_keys_can_leave_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    generate(tmp_path)
    keys = load_client_keys(tmp_path)
    for key, value in client_keys_to_env(keys).items():
        monkeypatch.setenv(key, value)
    assert client_keys_from_env(pop=True) == keys
    assert client_keys_from_env() is None and not any("CURVE" in k for k in os.environ)


def test_the_admin_credential_is_a_name_of_its_own_role() -> None:
    from specgen.runtime.auth import admin_credential, check_credential, new_client_token, new_join_secret, peer_credential

    secret = new_join_secret()
    cred = admin_credential(secret, "ops")
    assert check_credential(secret, "admin", "ops", "", cred)
    assert not check_credential(secret, "admin", "ops2", "", cred)
    assert cred not in (peer_credential(secret, role, "ops") for role in ("worker", "node", "reasoner"))
    tokens = {new_client_token() for _ in range(3)}
    assert len(tokens) == 3 and all(len(t) == 32 for t in tokens)


def test_each_start_of_a_reasoner_has_its_own_credential() -> None:
    from specgen.runtime.auth import new_join_secret, reasoner_credential, reasoner_start_of

    secret = new_join_secret()
    creds = [reasoner_credential(secret, "J", start) for start in (1, 2, 3)]
    assert len(set(creds)) == 3
    assert [reasoner_start_of(secret, "J", 3, c) for c in creds] == [1, 2, 3]
    assert reasoner_start_of(secret, "J", 2, creds[2]) is None        # a start not made yet
    assert reasoner_start_of(secret, "K", 3, creds[0]) is None        # another job's
    assert reasoner_start_of(secret, "J", 3, "é" * 64) is None        # not hex: refused, no error
