"""PendingCalls and its waiters: call ids, pending replies, kept messages, acknowledgements and re-sends."""
from __future__ import annotations

import concurrent.futures

import pytest

from specgen.messages import Ack, CandidateUpdate, GetStats, Ping, Verdict, WorkDone
from specgen.runtime.pending_calls import PendingCalls, Reply, Waiter, settle


def done_msg(request_id: str) -> WorkDone:
    return WorkDone(call_id=0, request_id=request_id, update=CandidateUpdate(
        job_id="j", candidate_id="c", stage="validate", verdict=Verdict()))


def test_numbering_gives_each_message_the_next_call_id_and_remembers_the_last() -> None:
    calls = PendingCalls()
    a, b = Ping(call_id=0), GetStats(call_id=0)
    assert (calls.number(a), calls.number(b)) == (1, 2)
    assert (a.call_id, b.call_id, calls.last_call_id) == (1, 2, 2)
    assert calls.next_call_id() == 3 and calls.last_call_id == 2   # an id for no message of ours
    assert calls.number(Ping(call_id=0)) == 4


def test_entries_are_added_found_popped_and_taken_by_what_they_request() -> None:
    calls = PendingCalls()
    futs = {}
    for msg in (Ping(call_id=0), GetStats(call_id=0), Ping(call_id=0)):
        cid = calls.number(msg)
        futs[cid] = concurrent.futures.Future()
        calls.add(cid, msg, futs[cid])
    assert calls.get(2)[0].call_id == 2 and calls.get(9) is None
    assert calls.pop(2)[1] is futs[2] and calls.pop(2) is None
    taken = calls.take(lambda msg: isinstance(msg, Ping))
    assert taken == [futs[1], futs[3]] and calls.pending == {}


def test_kept_messages_stay_until_acked_and_acks_settle_the_futures_of_requests() -> None:
    calls = PendingCalls()
    kept = [done_msg("r1"), done_msg("r2")]
    for msg in kept:
        calls.add(calls.number(msg), msg, None)
    ping = Ping(call_id=0)
    fut = concurrent.futures.Future()
    calls.add(calls.number(ping), ping, fut)
    assert calls.kept() == kept                                   # oldest first, requests excluded
    calls.note_acks([1, 3, 99])                                   # 99: acked twice, or never ours
    assert calls.kept() == kept and not fut.done()                # noted, not yet applied
    calls.apply_acks()
    assert [m.request_id for m in calls.kept()] == ["r2"]
    assert fut.result(0) == Ack(call_id=3)
    assert calls.acks_due == [] and set(calls.pending) == {2}


def test_only_what_was_sent_before_the_mark_is_sent_again_oldest_first_and_the_mark_clears() -> None:
    calls = PendingCalls()
    msgs = [Ping(call_id=0, payload=bytes([i])) for i in range(4)]
    futs = [concurrent.futures.Future() for _ in msgs]
    for msg, fut in zip(msgs[:3], futs):
        calls.add(calls.number(msg), msg, fut)
    calls.mark_resend()                                           # the connection lost its registration
    calls.add(calls.number(msgs[3]), msgs[3], futs[3])            # sent after: goes out anyway
    calls.note_acks([2])                                          # answered meanwhile: not sent again
    assert [(m.payload, f) for m, f in calls.to_resend()] == [(b"\x00", futs[0]), (b"\x02", futs[2])]
    assert futs[1].result(0) == Ack(call_id=2)
    assert calls.resend_upto == 0 and calls.to_resend() == []


def test_settle_leaves_a_settled_future_or_none_alone() -> None:
    fut = concurrent.futures.Future()
    settle(fut, "first")
    settle(fut, error=RuntimeError("late"))
    settle(None, "nobody waits")
    assert fut.result(0) == "first"
    failed = concurrent.futures.Future()
    settle(failed, error=ValueError("no"))
    with pytest.raises(ValueError, match="no"):
        failed.result(0)


def test_a_waiter_records_its_outcome_and_hands_on_progress_notices() -> None:
    seen = []
    waiter = Waiter(on_progress=seen.append)
    assert not waiter.done() and waiter.heard == 0.0
    waiter.progress("queued 3rd")
    assert seen == ["queued 3rd"] and waiter.notice == "queued 3rd" and waiter.heard > 0
    waiter.set_result(42)
    assert waiter.done() and waiter.value == 42 and waiter.error is None
    failing = Waiter()
    failing.progress("no callback: only recorded")
    failing.set_exception(RuntimeError("lost"))
    assert failing.done() and isinstance(failing.error, RuntimeError)


def test_waiting_on_a_reply_drives_the_connection_until_it_is_done_or_the_time_is_up() -> None:
    drives = []

    def drive(done, timeout):   # noqa: ANN001 - what the connection's drive would be given
        drives.append(timeout)
        if timeout is None:
            reply.set_result("pong")   # the reply arrives while this thread drives
        assert done() == (timeout is None)

    reply = Reply(drive)
    with pytest.raises(concurrent.futures.TimeoutError):
        reply.result(0.5)                                         # nothing came: not waited on again
    assert reply.result() == "pong" and drives == [0.5, None]
    failed = Reply(lambda done, timeout: failed.set_exception(KeyError("k")))
    assert isinstance(failed.exception(1.0), KeyError)
