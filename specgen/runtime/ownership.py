"""Whose a job is: who may submit its candidates, cancel it, follow it and read its results.

A job belongs to an *identity*, bound when the job is created (CreateJob) or, for a job id the
scheduler does not know yet (an optimize loop in its own process submitting through
SchedulerEvaluationBackend), by the first candidate submitted under it. A peer's identity:
- with CURVE on, "key:" and the client's public key (z85) as ZAP authenticated it. The scheduler
  reads it from every message (the frame's User-Id), so a connection that took over another
  peer's routing id (ROUTER_HANDOVER) is not taken for that peer;
- without CURVE, "token:" and a hash of the `client_token` in its Hello: a random secret each
  `Client` makes (runtime/client.py), kept across reconnections; a new Client given the same
  token acts for the same jobs. Only the hash is kept, in memory and in the journal;
- failing both (a hand-made peer that sends no token), "conn:" and its routing id: the jobs are
  its connection's.

The owner is journaled with the job (runtime/journal.py), so a restarted scheduler keeps it: a
client that comes back with the same key, or the same token, owns its jobs again.

Who may act for a job (`may_act_for`): its owner; its reasoner (role "reasoner", registered under
the job's id with the credential the join secret gives for that id), for that job only; and the
cluster's admin, a client whose Hello carried `auth.admin_credential(join secret, its name)`.
Whoever holds the join secret can already register as any job's reasoner, so being the admin
gives nothing more. Anyone else gets `ErrorReply(code="not_owner")` and nothing of the job changes.
"""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from specgen.messages import ErrorReply

if TYPE_CHECKING:
    from specgen.runtime.worker_registry import Peer

MIN_TOKEN_CHARS = 32   # a shorter client_token could be guessed; secrets.token_hex(16) makes 32


def identity_of(curve_key: str | None, client_token: str, peer: bytes) -> str:
    """The identity a peer owns jobs as: its CURVE key, else its client token, else its connection."""
    if curve_key is not None:
        return f"key:{curve_key}"
    if client_token:
        # A hash: neither the journal nor the stats hold what a client must present.
        return "token:" + hashlib.sha256(client_token.encode("utf-8", "replace")).hexdigest()[:32]
    return f"conn:{peer.hex()}"


def may_act_for(peer: Peer, job_id: str, owner: str) -> bool:
    """Whether `peer` may act for the job `job_id` whose owner is `owner` ("" for none recorded)."""
    if peer.admin:
        return True
    if peer.role == "reasoner":
        return peer.name == job_id
    return peer.role == "client" and bool(owner) and peer.owner == owner


def not_owner(job_id: str, action: str, ref: int) -> ErrorReply:
    return ErrorReply(code="not_owner", ref=ref, message=(
        f"job {job_id!r} is not yours: only the client that created it (the same CURVE key, or "
        f"without CURVE the same client token), the job's reasoner or the cluster's admin may "
        f"{action} it"))
