"""The scheduler core's gate on a job's requests: whether the peer asking may act for the job
(runtime/ownership.py says who may), and the answer to one that may not.

A part of the job book (job_book.py). A refusal is answered with ErrorReply "not_owner", counted
(`requests_not_owner`) and logged at most once a minute per peer name; nothing of the job changes.
"""
from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING, Callable, Mapping

from specgen.clock import Clock
from specgen.messages import ErrorReply, _Wire
from specgen.runtime.ownership import may_act_for, not_owner

if TYPE_CHECKING:
    from specgen.runtime.worker_registry import Peer

log = logging.getLogger("specgen.runtime.scheduler_core")   # one logger for the whole core


class JobAccess:
    def __init__(
        self,
        peers: Mapping[bytes, Peer],
        owner_of: Callable[[str], str | None],
        counters: collections.Counter,
        clock: Clock,
        reply: Callable[[bytes, _Wire], None],
    ) -> None:
        """`peers`: the worker registry's; `owner_of(job_id)`: the owner of a running or journaled
        job, None when the scheduler never had it (the job book's)."""
        self.peers = peers
        self.owner_of = owner_of
        self.counters = counters
        self.clock = clock
        self.reply = reply
        self._not_owner_logged: dict[str, float] = {}   # peer name -> last not-owner warning

    def refuse(self, peer: bytes, job_id: str, action: str, ref: int) -> None:
        self.counters["requests_not_owner"] += 1
        known = self.peers[peer]
        now = self.clock.now()
        last = self._not_owner_logged.get(known.name)
        if last is None or now - last > 60.0:   # one warning per peer a minute
            if len(self._not_owner_logged) > 1000:
                self._not_owner_logged.clear()
            self._not_owner_logged[known.name] = now
            log.warning("refused %s %r (peer %r): may not %s job %s, another's", known.role, known.name,
                        peer[:40], action, job_id)
        self.reply(peer, not_owner(job_id, action, ref))

    def may_act(self, peer: bytes, job_id: str, owner: str | None, action: str, ref: int) -> bool:
        """Whether `peer` may act for the job (`owner`: see `owner_of`); if not, it is told so."""
        if owner is None or may_act_for(self.peers[peer], job_id, owner):
            return True
        self.refuse(peer, job_id, action, ref)
        return False

    def may_act_on(self, peer: bytes, job_id: str, verb: str, call_id: int) -> bool:
        """Whether `peer` may `verb` the job; else answered (unknown job, or not its owner)."""
        owner = self.owner_of(job_id)
        if owner is None:
            self.reply(peer, ErrorReply(code="unknown_job", ref=call_id, message=f"no job {job_id!r}"))
            return False
        return self.may_act(peer, job_id, owner, verb, call_id)
