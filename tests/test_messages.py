import msgspec
import pytest

from specgen.messages import CandidateSubmission, CandidateUpdate, Verdict


def test_verdict_round_trip_is_exact():
    v = Verdict(compiled=True, correct=True, speedup=1.5, flags=["x"], stage_seconds={"compile": 0.1})
    data = msgspec.msgpack.encode(CandidateUpdate(job_id="j", candidate_id="c", stage="full", verdict=v))
    back = msgspec.msgpack.decode(data, type=CandidateUpdate)
    assert back.verdict == v


def test_decoding_is_strict():
    bad = msgspec.msgpack.encode({"job_id": "j", "candidate_id": 3})
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(bad, type=CandidateSubmission)
