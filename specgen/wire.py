"""A message on the wire is one frame: a 4-byte header (magic, protocol version, message kind)
followed by the msgpack body. One frame, not a header frame and a body frame, because every frame
costs a send and a receive call (each a trip into libzmq) at every hop.

Every ZeroMQ channel frames its messages this way: the actors' (specgen.runtime, which imports
this module as `specgen.runtime.wire`) and the KV pools' control channel (specgen.kv.pool_control).
It sits just above specgen.messages so that both layers can use it.

Decoding is strict and never raises anything but `WireError`, whose `code` and message go back
to the sender as an `ErrorReply`; a bad frame costs its sender an error, never the actor.
"""
from __future__ import annotations

import msgspec

from specgen.errors import SpecgenError
from specgen.messages import MESSAGE_TYPES, PROTOCOL_VERSION, ErrorReply, _Wire

MAGIC = b"SG"
HEADER_BYTES = 4

_encoder = msgspec.msgpack.Encoder()
_decoders = {kind: msgspec.msgpack.Decoder(cls) for kind, cls in MESSAGE_TYPES.items()}
_headers = {kind: MAGIC + bytes((PROTOCOL_VERSION, kind)) for kind in MESSAGE_TYPES}
_loose = msgspec.msgpack.Decoder()


class WireError(SpecgenError):
    """A frame that cannot be accepted; `ref` is the call_id when it could still be read."""

    def __init__(self, code: str, message: str, ref: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.ref = ref

    def reply(self) -> ErrorReply:
        return ErrorReply(code=self.code, message=self.message, ref=self.ref)


def encode(msg: _Wire) -> list[bytes]:
    """The frames of `msg` (one), ready for send_multipart after any routing frames."""
    buf = bytearray(_headers[msg.KIND])
    _encoder.encode_into(msg, buf, HEADER_BYTES)
    return [buf]


def _call_id_of(body: bytes | memoryview) -> int:
    """Best effort: the call_id of a body that failed typed decoding, so the error can be matched."""
    try:
        loose = _loose.decode(body)
    except Exception:  # noqa: BLE001 - any garbage simply has no call_id
        return 0
    ref = loose.get("call_id") if isinstance(loose, dict) else None
    return ref if isinstance(ref, int) and not isinstance(ref, bool) else 0


def _too_large(size: int, max_bytes: int, ref: int) -> WireError:
    return WireError(
        "too_large",
        f"message of {size} bytes exceeds the limit of {max_bytes} bytes "
        "(setting max_message_bytes); send less per message",
        ref,
    )


def decode(frames: list[bytes], max_bytes: int) -> _Wire:
    """Decode a message's frames (routing frames already removed): one, header + body."""
    if len(frames) == 1:
        return decode_frame(frames[0], max_bytes)
    size = sum(len(f) for f in frames)
    if size > max_bytes:
        raise _too_large(size, max_bytes, 0)
    raise WireError("malformed", f"expected 1 frame (header + body), got {len(frames)}")


def decode_frame(frame: bytes, max_bytes: int) -> _Wire:
    """Decode a message that came as one frame."""
    if len(frame) > max_bytes:
        raise _too_large(len(frame), max_bytes, _call_id_of(memoryview(frame)[HEADER_BYTES:]))
    header = frame[:HEADER_BYTES]
    if len(frame) < HEADER_BYTES or header[:2] != MAGIC:
        raise WireError(
            "malformed", f"bad header {bytes(header)!r}: not a specgen frame (expected b'SG' + version + kind)"
        )
    body = memoryview(frame)[HEADER_BYTES:]
    version, kind = header[2], header[3]
    if version != PROTOCOL_VERSION:
        raise WireError(
            "version",
            f"protocol version {version} is not supported (this peer speaks {PROTOCOL_VERSION}); "
            "run the same specgen version on every host",
            _call_id_of(body),
        )
    decoder = _decoders.get(kind)
    if decoder is None:
        raise WireError("unknown_kind", f"unknown message kind {kind}", _call_id_of(body))
    try:
        return decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        name = MESSAGE_TYPES[kind].__name__
        raise WireError("malformed", f"bad {name}: {exc}", _call_id_of(body)) from None
    except RecursionError:
        # Arrays or maps nested past the decoder's depth limit (in a field typed Any, or one it skips).
        name = MESSAGE_TYPES[kind].__name__
        raise WireError("malformed", f"bad {name}: nested too deeply", _call_id_of(body)) from None
