"""JobViews: a job's status, its event subscriptions and its verdicts' resync, read from the job book or the journal."""
from __future__ import annotations

import pytest

from specgen.messages import (
    Ack, CandidateUpdateNotice, CreateJob, ErrorReply, GetJob, Hello, JobEventNotice, JobResult, JobSpec,
    JobStatusReply, ReportJobResult, ResyncUpdates, SubscribeJob,
)

from tests.runtime.test_scheduler_core import CLIENT, PROBLEM, Harness, assigns, updates

AGAIN = b"client/c/2"          # CLIENT's owner on another connection (the same client token)
OTHER = b"client/other/1"
REASONER = b"reasoner/J/x"


@pytest.fixture
def h() -> Harness:
    """A running job J of CLIENT's with its reasoner, one verdict recorded and one candidate queued."""
    harness = Harness()
    harness.hello(CLIENT, "client", "c", client_token="c" * 32)
    harness.hello(AGAIN, "client", "c", client_token="c" * 32)
    harness.hello(OTHER, "client", "o", client_token="o" * 32)
    harness.send(CLIENT, CreateJob(call_id=harness.call_id(), spec=JobSpec(problem_source=PROBLEM, job_id="J")))
    harness.send(REASONER, Hello(role="reasoner", name="J"))
    w = harness.worker("n1/cpu0")
    [a] = assigns(harness.submit("c1", job="J", peer=REASONER, profile=False))
    harness.finish(w, a)
    harness.submit("c2", job="J", peer=REASONER, profile=False)
    return harness


def end(h: Harness) -> None:
    h.send(REASONER, ReportJobResult(call_id=h.call_id(), result=JobResult(job_id="J", status="succeeded")))
    assert "J" not in h.core.book.jobs


def events(out: list, peer: bytes = CLIENT) -> list:
    return [m.event for p, m in out if isinstance(m, JobEventNotice) and p == peer]


def test_status_of_a_running_job_and_of_an_ended_one_agree(h: Harness) -> None:
    running = h.core.views.job_status("J")
    assert (running.state, running.candidates, running.updates, running.result) == ("running", 2, 1, None)
    assert running.last_event_seq == h.core.book.jobs["J"].last_seq > 0
    [(to, reply)] = h.send(CLIENT, GetJob(call_id=h.call_id(), job_id="J"))
    assert to == CLIENT and isinstance(reply, JobStatusReply) and reply.status == running
    end(h)
    ended = h.core.views.job_status("J")                          # from the journal now
    assert (ended.state, ended.candidates, ended.spec.job_id, ended.attempts) == \
        ("finished", 2, "J", running.attempts)
    assert ended.updates == len(h.core.journal.updates_of("J")) >= 1 and ended.result.status == "succeeded"
    assert ended.last_event_seq > running.last_event_seq          # its end is an event too
    assert h.core.views.job_status("nope") is None
    [(_, err)] = h.send(CLIENT, GetJob(call_id=77, job_id="nope"))
    assert isinstance(err, ErrorReply) and err.code == "unknown_job" and err.ref == 77


def test_a_subscriber_gets_the_events_after_its_seq_then_each_new_one(h: Harness) -> None:
    history = h.core.journal.events_after("J", 0)
    assert [e.kind for e in history] == ["created", "reasoner_started", "verdict"]
    call = h.call_id()
    out = h.send(AGAIN, SubscribeJob(call_id=call, job_id="J", after_seq=history[0].seq))
    assert [e.kind for e in events(out, AGAIN)] == ["reasoner_started", "verdict"]
    assert out[-1] == (AGAIN, Ack(call_id=call))                  # acked after the history
    assert AGAIN in h.core.book.jobs["J"].subscribers
    # What happens next reaches it as it comes, as it reaches the job's other subscriber.
    out = h.send(REASONER, ReportJobResult(call_id=h.call_id(), result=JobResult(job_id="J", status="failed")))
    assert [(e.seq, e.kind) for e in events(out, AGAIN)] == [(e.seq, e.kind) for e in events(out, CLIENT)]
    assert events(out, AGAIN)[-1].kind == "finished" and events(out, AGAIN)[0].seq == history[-1].seq + 1


def test_a_peer_that_may_not_follow_the_job_is_refused_and_not_subscribed(h: Harness) -> None:
    call = h.call_id()
    [(to, err)] = h.send(OTHER, SubscribeJob(call_id=call, job_id="J"))
    assert to == OTHER and isinstance(err, ErrorReply) and (err.code, err.ref) == ("not_owner", call)
    assert OTHER not in h.core.book.jobs["J"].subscribers


def test_subscribing_to_an_ended_job_replays_its_history_from_the_journal(h: Harness) -> None:
    end(h)
    out = h.send(CLIENT, SubscribeJob(call_id=h.call_id(), job_id="J"))
    kinds = [e.kind for e in events(out)]
    assert kinds[0] == "created" and kinds[-1] == "finished"
    assert [e.seq for e in events(out)] == list(range(1, len(kinds) + 1))
    assert isinstance(out[-1][1], Ack)


def test_a_resync_sends_the_verdicts_again_and_makes_the_sender_the_submitter(h: Harness) -> None:
    call = h.call_id()
    out = h.send(AGAIN, ResyncUpdates(call_id=call, job_ids=["J"]))
    assert [(p, u.candidate_id, u.stage) for p, u in ((p, m.update) for p, m in out
                                                      if isinstance(m, CandidateUpdateNotice))] == [
        (AGAIN, "c1", "validate")]
    assert out[-1] == (AGAIN, Ack(call_id=call))
    assert h.core.book.jobs["J"].submitter == AGAIN               # the verdicts to come are its
    # Ended: the same verdicts, from the journal.
    end(h)
    out = h.send(AGAIN, ResyncUpdates(call_id=h.call_id(), job_ids=["J"]))
    assert [(u.candidate_id, u.stage) for u in updates(out)] == [
        (u.candidate_id, u.stage) for u in h.core.journal.updates_of("J")]
    assert ("c1", "validate") in [(u.candidate_id, u.stage) for u in updates(out)]
    assert isinstance(out[-1][1], Ack)


def test_a_resync_naming_one_job_not_the_senders_sends_nothing(h: Harness) -> None:
    h.send(OTHER, CreateJob(call_id=h.call_id(), spec=JobSpec(problem_source=PROBLEM, job_id="K")))
    call = h.call_id()
    [(to, err)] = h.send(OTHER, ResyncUpdates(call_id=call, job_ids=["K", "J"]))
    assert to == OTHER and isinstance(err, ErrorReply) and (err.code, err.ref) == ("not_owner", call)
    assert "'J'" in err.message
    assert h.core.book.jobs["J"].submitter == REASONER and h.core.book.jobs["K"].submitter is None
