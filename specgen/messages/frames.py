"""What every message framed on a ZeroMQ channel shares: the protocol version of its header and
`_Wire`, the base of its struct.

One frame per message: a 4-byte header (b"SG", the protocol version, the message kind: the `KIND`
of its struct), then that struct as msgpack. A ROUTER prepends the peer's routing id. `specgen.wire`
encodes and checks frames; `MESSAGE_TYPES` (messages/actors.py) maps kinds to structs.
"""
from __future__ import annotations

from typing import ClassVar

import msgspec

# Bumped on any incompatible change to a struct of specgen.messages; peers refuse a different version.
PROTOCOL_VERSION = 2


class _Wire(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    KIND: ClassVar[int] = 0
