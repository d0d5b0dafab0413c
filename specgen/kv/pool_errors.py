"""The KV pool's errors (block table, pool, segments, control channel). The copy extension's own
failures are `kv_extension().KvTransferError` (`specgen.kv.extension`)."""
from __future__ import annotations

from specgen.errors import SpecgenError


class KvPoolError(SpecgenError):
    """The pool cannot do what was asked (no room, unknown block, bad configuration)."""


class KvPoolTimeout(KvPoolError, TimeoutError):
    """A wait inside the pool ran out; the message names the setting that controls it."""

