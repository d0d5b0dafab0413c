"""Who may talk to the scheduler, and in which role.

Transport: loopback needs nothing, anything else needs ZeroMQ CURVE keys.

Key directory layout (made by `specgen keys generate DIR`):
    DIR/server.key, DIR/server.key_secret   the scheduler's keypair (the secret stays on its host)
    DIR/client.key, DIR/client.key_secret   a keypair for nodes and clients
    DIR/authorized/*.key                    public keys the scheduler accepts
Files use pyzmq's certificate format (`zmq.auth.create_certificates`).

Roles: anyone who reaches the socket may be a client (evaluate, submit, status: the public API),
but registering as a worker, a node or a job's reasoner takes a credential. A client acts for its
own jobs only (runtime/ownership.py says whose a job is); the cluster's *admin* is a client that
presents the admin credential of its name, and sees and acts for every job. The cluster's *join
secret* (32 random bytes, hex in a 0600 file) is known to the scheduler and to the nodes only;
a peer's credential is HMAC-SHA256(join secret, role, node, name), so it admits that one name in
that one role and reveals nothing of the secret. Who holds what:
- the scheduler reads the secret from `--join-secret FILE` (default STATE_DIR/join_secret, made
  on first start), or from its parent through the secrets pipe (LocalCluster: nothing on disk);
- a node reads it the same way (`specgen-node --join-secret FILE`, or the pipe) and derives a
  credential for each of its workers, handed to the worker through the secrets pipe (see
  `process.ChildProcess(secrets=...)`), never through the environment; likewise the scheduler
  for the reasoners it starts;
- a process presents its own credential in its Hello (`present_credential`, read by
  `transport.PeerConnection`); evaluation runners, started by workers, inherit none of this;
- the admin's is `admin_credential(secret, name)`: `Client(join_secret=...)` presents it, as
  `LocalCluster.client` and `specgen status --join-secret FILE` do.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import secrets as _random
import shutil
import socket as pysocket
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from specgen.errors import UsageError
from specgen.runtime.private_files import make_private_dir

KEYS_ENV = "SPECGEN_KEYS"   # default key directory for every command
JOIN_SECRET_ENV = "SPECGEN_JOIN_SECRET_FILE"   # default --join-secret of `specgen serve` and nodes
JOIN_SECRET_FILE = "join_secret"               # its name in the scheduler's state directory
DEFAULT_STATE_DIR = Path.home() / ".local" / "state" / "specgen" / "scheduler"
AUTHENTICATED_ROLES = ("worker", "node", "reasoner")
ADMIN_ROLE = "admin"   # not a Hello role: the role a client's admin credential is derived for
_CURVE_ENV = "SPECGEN_CURVE"


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


def client_keys_to_text(keys: ClientKeys) -> str:
    # Z85 never uses "," (it does use ":").
    return b",".join((keys.server_public, keys.public, keys.secret)).decode()


def client_keys_from_text(raw: str | None) -> ClientKeys | None:
    if not raw:
        return None
    server_public, public, secret = raw.encode().split(b",")
    return ClientKeys(server_public=server_public, public=public, secret=secret)


def client_keys_to_env(keys: ClientKeys | None) -> dict[str, str]:
    return {} if keys is None else {_CURVE_ENV: client_keys_to_text(keys)}


def client_keys_from_env(pop: bool = False) -> ClientKeys | None:
    """CURVE keys from the environment; `pop` also removes them, so that no child inherits them."""
    raw = os.environ.pop(_CURVE_ENV, None) if pop else os.environ.get(_CURVE_ENV)
    return client_keys_from_text(raw)


# -- join secret and credentials ---------------------------------------------------------

def new_join_secret() -> bytes:
    return _random.token_bytes(32)


def load_join_secret(path: Path, create: bool = False) -> bytes:
    """The join secret in `path` (hex); with `create`, a new one is written there (mode 0600) when
    the file does not exist yet."""
    path = Path(path)
    if create and not path.exists():
        make_private_dir(path.parent)   # the scheduler's state directory, on its first start
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass   # made by a concurrent start: read that one
        else:
            with os.fdopen(fd, "w") as f:
                f.write(new_join_secret().hex() + "\n")
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        raise UsageError(f"join secret file {path} not found (`specgen serve` writes "
                         f"STATE_DIR/{JOIN_SECRET_FILE} on its first start)") from None
    except OSError as exc:
        raise UsageError(f"cannot read join secret file {path}: {exc}") from None
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if len(secret) < 16:
        raise UsageError(f"join secret file {path} must hold at least 16 bytes as hex "
                         "(a line of 32+ hex digits)")
    return secret


def peer_credential(secret: bytes, role: str, name: str, node: str = "") -> str:
    """The credential of `name` in `role` (a worker's also names its node): hex HMAC-SHA256."""
    message = json.dumps(["specgen-peer/1", role, node, name]).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def reasoner_credential(secret: bytes, job_id: str, start: int) -> str:
    """The credential of the `start`-th reasoner the scheduler started for job `job_id`. Each start
    has its own, so a reasoner of an earlier start (one still exiting when a restarted scheduler
    starts the next) cannot register as the job's reasoner and take the job's messages."""
    return peer_credential(secret, "reasoner", job_id, node=f"start {start}")


def reasoner_start_of(secret: bytes, job_id: str, latest: int, presented: str) -> int | None:
    """Which of the job's starts 1..`latest` the presented reasoner credential is of (None: none)."""
    for start in range(latest, 0, -1):
        if check_credential(secret, "reasoner", job_id, f"start {start}", presented):
            return start
    return None


def admin_credential(secret: bytes, name: str) -> str:
    """The credential that makes the client `name` the cluster's admin (it sees and acts for every job)."""
    return peer_credential(secret, ADMIN_ROLE, name)


def new_client_token() -> str:
    """A client's token (Hello.client_token): without CURVE, what its jobs belong to."""
    return _random.token_hex(16)


def check_credential(secret: bytes, role: str, name: str, node: str, presented: str) -> bool:
    """Constant-time check of a presented credential."""
    expected = peer_credential(secret, role, name, node).encode()
    return hmac.compare_digest(expected, presented.encode("utf-8", "replace"))


_presented: dict[tuple[str, str], str] = {}


def present_credential(role: str, name: str, credential: str) -> None:
    """Make this process present `credential` in the Hello of its `role`/`name` connections."""
    _presented[(role, name)] = credential


def presented_credential(role: str, name: str) -> str:
    return _presented.get((role, name), "")


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
