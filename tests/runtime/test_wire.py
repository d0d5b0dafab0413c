import msgspec
import pytest

from specgen.messages import (
    MESSAGE_TYPES, PROTOCOL_VERSION, CandidateSubmission, Hello, Ping, SubmitCandidate,
)
from specgen.runtime import wire


def test_every_message_kind_is_unique_and_round_trips() -> None:
    assert len({cls.KIND for cls in MESSAGE_TYPES.values()}) == len(MESSAGE_TYPES)
    sub = CandidateSubmission(job_id="j", candidate_id="c", problem_name="p", problem_source="s",
                              candidate_source="x", deadline=3.5)
    for msg in (Hello(role="worker", name="n/cpu0", busy_key=["j", "c", "validate"]),
                SubmitCandidate(call_id=9, submission=sub), Ping(call_id=1, payload=b"\x00\xff")):
        frames = wire.encode(msg)
        assert len(frames) == 1 and frames[0][:4] == b"SG" + bytes((PROTOCOL_VERSION, msg.KIND))
        assert wire.decode(frames, 1 << 20) == msg


@pytest.mark.parametrize(
    "frames, code",
    [
        ([b"garbage"], "malformed"),
        ([b"SG" + bytes((PROTOCOL_VERSION, Ping.KIND)), msgspec.msgpack.encode({"call_id": 1})], "malformed"),
        ([b"XX\x01\x01"], "malformed"),
        ([b"SG\x01"], "malformed"),
        ([b"SG" + bytes((PROTOCOL_VERSION + 1, 27)) + msgspec.msgpack.encode({"call_id": 4})], "version"),
        ([b"SG" + bytes((PROTOCOL_VERSION, 250)) + msgspec.msgpack.encode({"call_id": 5})], "unknown_kind"),
        ([b"SG" + bytes((PROTOCOL_VERSION, Ping.KIND)) + b"\xc1\xc1"], "malformed"),
    ],
)
def test_bad_frames_raise_wire_errors_with_codes(frames: list[bytes], code: str) -> None:
    with pytest.raises(wire.WireError) as info:
        wire.decode(frames, 1 << 20)
    assert info.value.code == code
    assert info.value.reply().message


def test_typed_decoding_is_strict_and_keeps_the_call_id_for_the_error() -> None:
    body = msgspec.msgpack.encode({"call_id": 77, "submission": {"job_id": 3}})
    with pytest.raises(wire.WireError) as info:
        wire.decode([b"SG" + bytes((PROTOCOL_VERSION, SubmitCandidate.KIND)) + body], 1 << 20)
    assert info.value.code == "malformed" and info.value.ref == 77
    assert "SubmitCandidate" in info.value.message


def test_oversized_messages_name_the_setting() -> None:
    frames = wire.encode(Ping(call_id=3, payload=b"x" * 5000))
    with pytest.raises(wire.WireError) as info:
        wire.decode(frames, 4096)
    assert info.value.code == "too_large" and info.value.ref == 3
    assert "max_message_bytes" in info.value.message
