"""The actors' framing: specgen/wire.py, below the runtime because the KV pools' control channel
(specgen.kv.pool_control) frames its messages the same way. The actors import it under this name."""
from specgen.wire import HEADER_BYTES, MAGIC, WireError, decode, decode_frame, encode

__all__ = ["HEADER_BYTES", "MAGIC", "WireError", "decode", "decode_frame", "encode"]
