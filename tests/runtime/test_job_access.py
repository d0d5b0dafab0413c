"""JobAccess: who may act for a job, and how a peer that may not is answered, counted and logged."""
from __future__ import annotations

import collections
import logging

import pytest

from specgen.clock import VirtualClock
from specgen.messages import ErrorReply
from specgen.runtime.job_access import JobAccess
from specgen.runtime.worker_registry import Peer

OWNER, OTHER, REASONER, ADMIN = b"client/owner/1", b"client/other/1", b"reasoner/J/1", b"client/admin/1"


class Gate:
    def __init__(self) -> None:
        self.clock = VirtualClock(100.0)
        self.counters: collections.Counter = collections.Counter()
        self.sent: list[tuple[bytes, object]] = []
        self.owners = {"J": "token:owner", "K": "token:other"}
        self.peers = {
            OWNER: Peer(id=OWNER, role="client", name="owner", last_seen=0.0, owner="token:owner"),
            OTHER: Peer(id=OTHER, role="client", name="other", last_seen=0.0, owner="token:other"),
            REASONER: Peer(id=REASONER, role="reasoner", name="J", last_seen=0.0, owner="conn:r"),
            ADMIN: Peer(id=ADMIN, role="client", name="admin", last_seen=0.0, owner="token:admin", admin=True),
        }
        self.access = JobAccess(self.peers, self.owners.get, self.counters, self.clock,
                                lambda peer, msg: self.sent.append((peer, msg)))


@pytest.fixture
def gate() -> Gate:
    return Gate()


def test_the_owner_the_jobs_reasoner_and_the_admin_may_act_and_are_told_nothing(gate: Gate) -> None:
    assert gate.access.may_act_on(OWNER, "J", "read", 1)
    assert gate.access.may_act_on(REASONER, "J", "submit candidates to", 2)
    assert gate.access.may_act_on(ADMIN, "J", "cancel", 3)
    assert gate.access.may_act_on(ADMIN, "K", "cancel", 4)
    assert gate.sent == [] and gate.counters["requests_not_owner"] == 0


def test_a_job_the_scheduler_never_had_is_anyones_to_open_but_unknown_to_act_on(gate: Gate) -> None:
    assert gate.access.may_act(OTHER, "new", None, "submit candidates to", 5)   # no owner yet
    assert gate.sent == []
    assert not gate.access.may_act_on(OTHER, "new", "read", 6)
    [(peer, err)] = gate.sent
    assert peer == OTHER and isinstance(err, ErrorReply)
    assert err.code == "unknown_job" and err.ref == 6 and "'new'" in err.message
    assert gate.counters["requests_not_owner"] == 0


def test_another_client_or_another_jobs_reasoner_is_refused_naming_the_job_and_the_action(gate: Gate) -> None:
    assert not gate.access.may_act_on(OTHER, "J", "follow", 7)
    assert not gate.access.may_act_on(REASONER, "K", "cancel", 8)
    assert [(p, e.code, e.ref) for p, e in gate.sent] == [(OTHER, "not_owner", 7), (REASONER, "not_owner", 8)]
    first, second = (e.message for _, e in gate.sent)
    assert "'J'" in first and "may follow it" in first
    assert "'K'" in second and "may cancel it" in second
    assert gate.counters["requests_not_owner"] == 2
    # An empty recorded owner is no one's: only the admin and the job's reasoner act for it.
    assert not gate.access.may_act(OWNER, "J", "", "read", 9)
    assert gate.access.may_act(REASONER, "J", "", "read", 10)


def test_refusals_are_logged_once_a_minute_per_peer_name(gate: Gate, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="specgen.runtime.scheduler_core")

    def warnings() -> int:
        return sum("may not" in r.getMessage() for r in caplog.records)

    for ref in range(5):
        gate.access.refuse(OTHER, "J", "read", ref)
    assert warnings() == 1
    gate.access.refuse(REASONER, "K", "read", 5)            # another peer: its own warning
    assert warnings() == 2
    gate.clock.advance(59.0)
    gate.access.refuse(OTHER, "J", "read", 6)
    assert warnings() == 2
    gate.clock.advance(2.0)
    gate.access.refuse(OTHER, "J", "read", 7)
    assert warnings() == 3
    # Every refusal is answered and counted, logged or not.
    assert len(gate.sent) == 8 and gate.counters["requests_not_owner"] == 8
    assert all(e.code == "not_owner" for _, e in gate.sent)
