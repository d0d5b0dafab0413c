"""Messages round-trip exactly, decode strictly, and keep their wire format: the bytes a message
encodes to (field names and order, tags, kinds, omitted defaults) are what peers of this protocol
version read."""
import msgspec
import pytest

from specgen import wire
from specgen.messages import (
    MESSAGE_TYPES, Ack, Arg, BuildRecord, CandidateSubmission, CandidateUpdate, EvalOptions, Hand,
    Hello, JobEvent, JobProgress, KvPoolResize, KvPoolStats, KvPoolView, Look, OptimizeEvent, ParamInfo,
    ProblemLoaded, RunnerReply, RunnerRequest, Slot, TriggerSettings, Verdict, WorkDone, WorkerStat,
)


def test_verdict_round_trip_is_exact():
    v = Verdict(compiled=True, correct=True, speedup=1.5, flags=["x"], stage_seconds={"compile": 0.1})
    data = msgspec.msgpack.encode(CandidateUpdate(job_id="j", candidate_id="c", stage="full", verdict=v))
    back = msgspec.msgpack.decode(data, type=CandidateUpdate)
    assert back.verdict == v


def test_decoding_is_strict():
    bad = msgspec.msgpack.encode({"job_id": "j", "candidate_id": 3})
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(bad, type=CandidateSubmission)


def _samples() -> dict[str, object]:
    """One message or more of every family, with nested structs, tags and omitted defaults."""
    slot = Slot(offset=0, shape=[4], dtype="float32")
    kv = KvPoolStats(pool_id="p", used_blocks=3, bytes_by_device={-1: 4096}, devices=[-1])
    update = CandidateUpdate(job_id="j", candidate_id="c", stage="full", verdict=Verdict(speedup=2.0))
    return {
        "verdict": Verdict(compiled=True, flags=["x"], stage_seconds={"load": 0.5}),
        "submission": CandidateSubmission(job_id="j", candidate_id="c", problem_name="p",
                                          problem_source="s", candidate_source="t"),
        "eval_options": EvalOptions(trials=3, seed=5),
        "hand": Hand(index=3, seed=11, shape={"N": 4}),
        "look": Look(index=3, digest_seed=13, outputs=[slot]),
        "arg": Arg(slot=slot),
        "problem_loaded": ProblemLoaded(params=[ParamInfo(name="w", shape=[2], numel=2)],
                                        builds=[BuildRecord(name="e", key="k", ok=True)]),
        "hello": Hello(role="worker", name="n/cpu0", pid=42),
        "ack": Ack(call_id=1, count=2),
        "work_done": WorkDone(request_id="r", update=update, call_id=9),
        "kv_pool_stats": kv,
        "kv_pool_resize": KvPoolResize(target_bytes=1024),
        "kv_pool_view": KvPoolView(pool="q", stats=kv, target_bytes=5),
        "worker_stat": WorkerStat(name="n/cpu0", busy_stage="validate", pid=4),
        "job_event": JobEvent(job_id="j", seq=1, kind="started", data={"a": 1}),
        "triggers": TriggerSettings(cues=["wait"]),
        "optimize_event": OptimizeEvent(job_id="j", kind="fork_started", t=1.0,
                                        progress=JobProgress(forks=2)),
    }


# What _samples() encode to: the framed ones (a KIND) as wire.encode's frame, the others as msgpack.
ENCODED = {
    "verdict": (
        "de0015a57374616765a466756c6ca8636f6d70696c6564c3a7636f7272656374c2ad6d61785f6162735f6572"
        "726f72c0ad6d61785f72656c5f6572726f72c0a67265665f6d73c0ac63616e6469646174655f6d73c0a77370"
        "6565647570c0af7265665f636f6d70696c65645f6d73c0a6737072656164c0a6646576696365a3637075aa63"
        "70755f74696d696e67c3a5666c61677391a178a56572726f72c0a4636f6465a0ad73746167655f7365636f6e"
        "647381a46c6f6164cb3fe0000000000000aa7265665f636163686564c2a8666c6f6f725f6d73c0ab6f766572"
        "686561645f6d73c0a56e6f74657390a773616e64626f78a46e6f6e65"
    ),
    "submission": (
        "8aa66a6f625f6964a16aac63616e6469646174655f6964a163ac70726f626c656d5f6e616d65a170ae70726f"
        "626c656d5f736f75726365a173b063616e6469646174655f736f75726365a174a66f726967696ea566696e61"
        "6ca9697465726174696f6e00ac6578747261637465645f6174cb0000000000000000a8646561646c696e65c0"
        "a770726f66696c65c3"
    ),
    "eval_options": (
        "de001ea6747269616c7303a47365656405a461746f6cc0a472746f6cc0ac7365636f6e645f7368617065c3b1"
        "72616e646f6d697a65645f706172616d73c3a67761726d757003ad74696d696e675f747269616c7332af6f76"
        "6572686561645f747269616c730fb4636865636b65645f74696d65645f747269616c7302af74696d696e675f"
        "6275646765745f73cb4000000000000000b16d696e5f74696d696e675f747269616c730ab17265665f626573"
        "6964655f747269616c730fb0636f6d70696c655f626173656c696e65c2b063616368655f7265665f74696d69"
        "6e67c3ab666c6f6f725f636865636bc3b27065616b5f62616e6477696474685f676273c0ab7065616b5f7466"
        "6c6f7073c0a974696d656f75745f73cb4072c00000000000af6275696c645f74696d656f75745f73cb408c20"
        "0000000000af737061776e5f74696d656f75745f73cb405e000000000000af6d656d6f72795f6c696d69745f"
        "6d62cd2000af6275696c645f6d656d6f72795f6d62cd4000b36770755f6d656d6f72795f6672616374696f6e"
        "cb3feccccccccccccda773616e64626f78a87265717569726564aa736372617463685f6d62cd0400b0627569"
        "6c645f736372617463685f6d62cd1000ad6d61785f70726f636573736573cd0200a963616368655f646972c0"
        "ad70726f626c656d5f7363616c65a46175746f"
    ),
    "hand": "85a474797065a468616e64a5696e64657803a4736565640ba5736861706581a14e04a56561726c79c2",
    "look": (
        "84a474797065a46c6f6f6ba5696e64657803ab6469676573745f736565640da76f7574707574739193009104"
        "a7666c6f61743332"
    ),
    "arg": "9293009104a7666c6f61743332c0",
    "problem_loaded": (
        "8ba474797065ae70726f626c656d5f6c6f61646564a56572726f72c0a6706172616d739193a177910202ab69"
        "6e7075745f627974657300ac6f75747075745f627974657300ab706172616d5f627974657300a468616c66c2"
        "a5666c6f7073c0af73686170655f636f6e7374616e747380a66275696c64739187a46e616d65a165a36b6579"
        "a16ba26f6bc3a77365636f6e6473cb0000000000000000a6636163686564c2a56572726f72c0ab6465766963"
        "655f636f6465c3ac6b65726e656c5f6b696e647390"
    ),
    "hello": "5347020183a4726f6c65a6776f726b6572a46e616d65a66e2f63707530a37069642a",
    "ack": "5347020982a763616c6c5f696401a5636f756e7402",
    "work_done": (
        "5347021f83aa726571756573745f6964a172a675706461746588a66a6f625f6964a16aac63616e6469646174"
        "655f6964a163a57374616765a466756c6ca776657264696374de0015a57374616765a466756c6ca8636f6d70"
        "696c6564c2a7636f7272656374c2ad6d61785f6162735f6572726f72c0ad6d61785f72656c5f6572726f72c0"
        "a67265665f6d73c0ac63616e6469646174655f6d73c0a773706565647570cb4000000000000000af7265665f"
        "636f6d70696c65645f6d73c0a6737072656164c0a6646576696365a3637075aa6370755f74696d696e67c3a5"
        "666c61677390a56572726f72c0a4636f6465a0ad73746167655f7365636f6e647380aa7265665f6361636865"
        "64c2a8666c6f6f725f6d73c0ab6f766572686561645f6d73c0a56e6f74657390a773616e64626f78a46e6f6e"
        "65a6776f726b6572a0aa737461727465645f6174cb0000000000000000ab66696e69736865645f6174cb0000"
        "000000000000a963616e63656c6c6564c2a763616c6c5f696409"
    ),
    "kv_pool_stats": (
        "53470223de0004a7706f6f6c5f6964a170ab757365645f626c6f636b7303af62797465735f62795f64657669"
        "636581ffcd1000a76465766963657391ff"
    ),
    "kv_pool_resize": "5347022481ac7461726765745f6279746573cd0400",
    "kv_pool_view": (
        "83a4706f6f6ca171a57374617473de0004a7706f6f6c5f6964a170ab757365645f626c6f636b7303af627974"
        "65735f62795f64657669636581ffcd1000a76465766963657391ffac7461726765745f627974657305"
    ),
    "worker_stat": "83a46e616d65a66e2f63707530aa627573795f7374616765a876616c6964617465a370696404",
    "job_event": (
        "85a66a6f625f6964a16aa373657101a46b696e64a773746172746564a174cb0000000000000000a464617461"
        "81a16101"
    ),
    "triggers": (
        "89ae65766572795f6e5f746f6b656e7300b47374727563747572655f626f756e646172696573c3a463756573"
        "91a477616974ae6d696e5f6761705f746f6b656e73cd0140b76d61785f666f726b735f7065725f6974657261"
        "74696f6e0ab36d61785f666f726b735f696e5f666c6967687402b071756575655f73617475726174696f6ecb"
        "4000000000000000ac62617272656e5f666f726b7302b562617272656e5f6261636b6f66665f746f6b656e73"
        "cd0300"
    ),
    "optimize_event": (
        "8ba66a6f625f6964a16aa46b696e64ac666f726b5f73746172746564a174cb3ff0000000000000a969746572"
        "6174696f6e00aa726571756573745f6964a0ac63616e6469646174655f6964a0a66f726967696ea0a8706f73"
        "6974696f6ec0a6726561736f6ea0a6757064617465c0a870726f67726573738ba9656c61707365645f73cb00"
        "00000000000000a9697465726174696f6e00b0726561736f6e696e675f746f6b656e7300ab666f726b5f746f"
        "6b656e7300a5666f726b7302ad666f726b735f72756e6e696e6700aa63616e6469646174657300aa76616c69"
        "646174696e6700a970726f66696c696e6700a870726f66696c656400ac626573745f73706565647570c0"
    ),
}


# Every frame's kind: a peer reads the header's kind byte as this type.
KINDS = {
    1: "Hello", 2: "Welcome", 3: "Heartbeat", 4: "HeartbeatAck", 5: "ErrorReply", 6: "Goodbye", 7:
    "DeadNotice", 8: "WorkerReady", 9: "Ack", 10: "SubmitCandidate", 11: "SubmitAck", 12:
    "CandidateUpdateNotice", 13: "EvaluateRequest", 14: "EvaluateReply", 15: "CancelJob", 16: "CreateJob",
    17: "JobCreated", 18: "SubscribeJob", 19: "JobEventNotice", 20: "GetJob", 21: "JobStatusReply", 22:
    "ReportJobEvent", 23: "ReportJobResult", 24: "ResyncUpdates", 25: "GetStats", 26: "StatsReply", 27:
    "Ping", 28: "Pong", 30: "AssignWork", 31: "WorkDone", 32: "CancelWork", 33: "WorkerExited", 34:
    "EvaluateQueued", 35: "KvPoolStats", 36: "KvPoolResize",
}


def _encoded(message: object) -> bytes:
    if hasattr(message, "KIND"):
        return b"".join(wire.encode(message))
    return msgspec.msgpack.encode(message)


@pytest.mark.parametrize("name", sorted(ENCODED))
def test_a_message_encodes_to_its_wire_bytes(name: str) -> None:
    assert _encoded(_samples()[name]).hex() == ENCODED[name]


def test_the_wire_bytes_decode_to_the_message() -> None:
    samples = {name: bytes.fromhex(hexed) for name, hexed in ENCODED.items()}
    expected = _samples()
    for name in ("hello", "ack", "work_done", "kv_pool_stats", "kv_pool_resize"):
        assert wire.decode_frame(samples[name], 1 << 20) == expected[name]
    requests, replies = msgspec.msgpack.Decoder(RunnerRequest), msgspec.msgpack.Decoder(RunnerReply)
    assert requests.decode(samples["hand"]) == expected["hand"]
    assert requests.decode(samples["look"]) == expected["look"]
    assert replies.decode(samples["problem_loaded"]) == expected["problem_loaded"]


def test_every_kind_names_its_message() -> None:
    assert {kind: cls.__name__ for kind, cls in MESSAGE_TYPES.items()} == KINDS


def test_stages_and_verdict_codes_are_typed_on_the_wire() -> None:
    """A stage or verdict code outside the known ones is refused where the message is decoded,
    with the field named; the known ones travel as the same strings."""
    import msgspec

    from specgen.messages import STAGES, VERDICT_CODES, CandidateUpdate, Verdict

    assert STAGES == ("validate", "profile", "full") and "timeout" in VERDICT_CODES
    good = CandidateUpdate(job_id="j", candidate_id="c", stage="profile",
                           verdict=Verdict(stage="profile", code="timeout"))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(good), type=CandidateUpdate) == good
    for field, bad in (("stage", {"stage": "lint"}), ("verdict.code", {"verdict": {"code": "slow"}})):
        raw = {**msgspec.to_builtins(good), **bad}
        with pytest.raises(msgspec.ValidationError, match=f"\\$\\.{field}"):
            msgspec.msgpack.decode(msgspec.msgpack.encode(raw), type=CandidateUpdate)
