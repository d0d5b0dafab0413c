"""Errors raised by specgen.kv."""
from __future__ import annotations

from specgen.errors import SpecgenError


class KvPoolError(SpecgenError):
    """The pool cannot do what was asked (no room, unknown block, bad configuration)."""


class KvPoolTimeout(KvPoolError, TimeoutError):
    """A wait inside the pool ran out; the message names the setting that controls it."""


def kv_transfer_error() -> type[Exception]:
    """The exception type the compiled extension raises (a RuntimeError whose message starts with
    the C++/CUDA source file and line that failed)."""
    from specgen.kv.extension import kv_extension

    return kv_extension().KvTransferError
