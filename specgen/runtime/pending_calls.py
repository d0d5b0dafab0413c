"""A `PeerConnection`'s calls (transport.py): the requests sent and not yet answered, by call_id,
and the messages kept until the scheduler acknowledges them (a worker's results, `send_kept`).

This part owns the call ids, the pending entries (the request and its Future; None for a kept
message), the acknowledgements not yet applied, and how far back the requests are to be sent again
once the connection registers again. `Waiter` and `Reply` are what a caller waits on.
"""
from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
from typing import Any, Callable

from specgen.messages import Ack, _Wire


def settle(fut: concurrent.futures.Future | None, result: Any = None,
           error: BaseException | None = None) -> None:
    if fut is None or fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class Waiter:
    """What a blocking request() waits on: the part of a Future the connection uses, without the
    condition variable and callbacks (the waiting thread drives the socket and sees it done).
    Progress notices of the request (EvaluateQueued) go to `progress`."""

    __slots__ = ("value", "error", "finished", "heard", "notice", "on_progress")

    def __init__(self, on_progress: Callable[[Any], None] | None = None) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self.heard = 0.0          # monotonic time of the latest progress notice; 0: none yet
        self.notice: Any = None   # that notice
        self.on_progress = on_progress

    def progress(self, notice: Any) -> None:
        self.heard, self.notice = time.monotonic(), notice
        if self.on_progress is not None:
            self.on_progress(notice)

    def done(self) -> bool:
        return self.finished

    def set_result(self, value: Any) -> None:
        self.value, self.finished = value, True

    def set_exception(self, error: BaseException) -> None:
        self.error, self.finished = error, True


class Reply(concurrent.futures.Future):
    """A request's Future: waiting on it drives the connection from the waiting thread."""

    def __init__(self, drive: Callable[[Callable[[], bool], float | None], None]) -> None:
        super().__init__()
        self._drive = drive

    def result(self, timeout: float | None = None) -> Any:
        self._drive(self.done, timeout)
        return super().result(0 if not self.done() else None)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._drive(self.done, timeout)
        return super().exception(0 if not self.done() else None)


class PendingCalls:
    def __init__(self) -> None:
        self._ids = itertools.count(1)
        # call_id -> (request, its Future; None for a message kept until acked, see send_kept)
        self.pending: dict[int, tuple[_Wire, concurrent.futures.Future | None]] = {}
        self._lock = threading.Lock()
        self.last_call_id = 0
        self.resend_upto = 0
        self.acks_due: list[int] = []   # acked call_ids not yet dropped from `pending`

    def next_call_id(self) -> int:
        return next(self._ids)

    def number(self, msg: _Wire) -> int:
        """Give `msg` the next call_id."""
        call_id = next(self._ids)
        self.last_call_id = call_id
        msg.call_id = call_id  # type: ignore[attr-defined]
        return call_id

    def add(self, call_id: int, msg: _Wire, fut: Any) -> None:
        with self._lock:
            self.pending[call_id] = (msg, fut)

    def get(self, call_id: int) -> tuple[_Wire, Any] | None:
        with self._lock:
            return self.pending.get(call_id)

    def pop(self, call_id: int) -> tuple[_Wire, Any] | None:
        with self._lock:
            return self.pending.pop(call_id, None)

    def take(self, which: Callable[[_Wire], bool]) -> list[Any]:
        """Forget the entries whose request `which` names; returns their Futures."""
        with self._lock:
            doomed = [(cid, e) for cid, e in self.pending.items() if which(e[0])]
            for cid, _ in doomed:
                del self.pending[cid]
        return [fut for _, (_, fut) in doomed]

    def kept(self) -> list[_Wire]:
        """The messages sent with send_kept that are not acknowledged yet, oldest first."""
        with self._lock:
            return [msg for msg, fut in self.pending.values() if fut is None]

    # -- acknowledgements and re-sends --------------------------------------------------------
    def note_acks(self, acked: list[int]) -> None:
        self.acks_due += acked

    def apply_acks(self) -> None:
        call_ids, self.acks_due = self.acks_due, []
        with self._lock:
            entries = [self.pending.pop(cid, None) for cid in call_ids]
        for entry in entries:
            if entry is not None and entry[1] is not None:
                settle(entry[1], Ack(call_id=entry[0].call_id))  # type: ignore[attr-defined]

    def mark_resend(self) -> None:
        """Everything sent until now is to be sent again once the connection is registered."""
        self.resend_upto = self.last_call_id

    def to_resend(self) -> list[tuple[_Wire, Any]]:
        """What `mark_resend` marked and is still pending, oldest first, (request, Future); the
        mark is cleared."""
        self.apply_acks()
        upto, self.resend_upto = self.resend_upto, 0
        with self._lock:
            items = [(cid, entry) for cid, entry in self.pending.items() if cid <= upto]
        return [entry for _, entry in sorted(items, key=lambda item: item[0])]
