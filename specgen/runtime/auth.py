"""Who may talk to the scheduler: loopback needs nothing, anything else needs ZeroMQ CURVE keys.

Key directory layout (made by `specgen keys generate DIR`):
    DIR/server.key, DIR/server.key_secret   the scheduler's keypair (the secret stays on its host)
    DIR/client.key, DIR/client.key_secret   a keypair for nodes and clients
    DIR/authorized/*.key                    public keys the scheduler accepts
Files use pyzmq's certificate format (`zmq.auth.create_certificates`).
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import socket as pysocket
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from specgen.errors import UsageError

KEYS_ENV = "SPECGEN_KEYS"   # default key directory for every command


def is_loopback(address: str) -> bool:
    """True for ipc://, inproc:// and tcp:// on a loopback address or name."""
    scheme, _, rest = address.partition("://")
    if scheme in ("ipc", "inproc"):
        return True
    if scheme != "tcp":
        raise UsageError(f"address {address!r} must start with tcp://, ipc:// or inproc://")
    host = urlsplit("tcp://" + rest).hostname or ""
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback
                   for info in pysocket.getaddrinfo(host, None))
    except (OSError, ValueError):
        return False


@dataclass
class ServerKeys:
    public: bytes
    secret: bytes
    authorized: set[bytes] = field(default_factory=set)   # z85 client public keys


@dataclass
class ClientKeys:
    server_public: bytes
    public: bytes
    secret: bytes


def generate(directory: Path, clients: int = 1) -> list[Path]:
    """Make a server keypair and `clients` client keypairs; authorize the clients. Returns files."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "authorized").mkdir(exist_ok=True)
    made: list[Path] = []
    if (directory / "server.key_secret").exists():
        raise UsageError(f"{directory} already holds server keys; pick an empty directory")
    public, secret = zmq.auth.create_certificates(str(directory), "server")
    made += [Path(public), Path(secret)]
    for i in range(clients):
        name = "client" if i == 0 else f"client{i}"
        public, secret = zmq.auth.create_certificates(str(directory), name)
        shutil.copy(public, directory / "authorized" / Path(public).name)
        made += [Path(public), Path(secret)]
    for path in directory.glob("*.key_secret"):
        os.chmod(path, 0o600)
    return made


def _load(path: Path) -> tuple[bytes, bytes | None]:
    if not path.exists():
        raise UsageError(f"key file {path} not found (make keys with `specgen keys generate DIR`)")
    try:
        return zmq.auth.load_certificate(str(path))
    except (ValueError, OSError) as exc:
        raise UsageError(f"cannot read key file {path}: {exc}") from None


def load_server_keys(directory: Path) -> ServerKeys:
    public, secret = _load(directory / "server.key_secret")
    if secret is None:
        raise UsageError(f"{directory / 'server.key_secret'} holds no secret key")
    authorized: set[bytes] = set()
    auth_dir = directory / "authorized"
    if auth_dir.is_dir():
        for path in sorted(auth_dir.glob("*.key")):
            authorized.add(_load(path)[0])
    return ServerKeys(public=public, secret=secret, authorized=authorized)


def load_client_keys(directory: Path, name: str = "client") -> ClientKeys:
    server_public, _ = _load(directory / "server.key")
    public, secret = _load(directory / f"{name}.key_secret")
    if secret is None:
        raise UsageError(f"{directory / (name + '.key_secret')} holds no secret key")
    return ClientKeys(server_public=server_public, public=public, secret=secret)


def ephemeral_client_keys(server: ServerKeys) -> ClientKeys:
    """A fresh keypair the scheduler authorizes for its own children (reasoners)."""
    public, secret = zmq.curve_keypair()
    server.authorized.add(public)
    return ClientKeys(server_public=server.public, public=public, secret=secret)


def client_keys_to_env(keys: ClientKeys | None) -> dict[str, str]:
    if keys is None:
        return {}
    # Z85 never uses "," (it does use ":").
    return {"SPECGEN_CURVE": b",".join((keys.server_public, keys.public, keys.secret)).decode()}


def client_keys_from_env() -> ClientKeys | None:
    raw = os.environ.get("SPECGEN_CURVE")
    if not raw:
        return None
    server_public, public, secret = raw.encode().split(b",")
    return ClientKeys(server_public=server_public, public=public, secret=secret)


def require_keys_for(address: str, keys: object | None, flag: str = "--keys") -> None:
    if keys is None and not is_loopback(address):
        raise UsageError(
            f"{address} is not a loopback address: authentication is required; pass {flag} DIR "
            "(make keys with `specgen keys generate DIR`)"
        )


def apply_client_keys(sock: zmq.Socket, keys: ClientKeys) -> None:
    sock.curve_serverkey = keys.server_public
    sock.curve_publickey = keys.public
    sock.curve_secretkey = keys.secret


class CurveGate:
    """The scheduler's side: a ZAP authenticator that accepts only authorized client keys."""

    def __init__(self, ctx: zmq.Context, keys: ServerKeys) -> None:
        self.keys = keys
        self.denied = 0
        self._auth = ThreadAuthenticator(ctx)
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=self)

    def callback(self, domain: str, client_key: bytes) -> bool:
        ok = client_key in self.keys.authorized
        if not ok:
            self.denied += 1
        return ok

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_server = True
        sock.curve_publickey = self.keys.public
        sock.curve_secretkey = self.keys.secret

    def stop(self) -> None:
        self._auth.stop()
