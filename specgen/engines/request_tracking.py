"""Bookkeeping of live generations shared by every backend: unique ids and prompt aborts.

An abort must take effect at the call, not when the backend gets round to it: once `abort(id)` has
been called, the stream yields no further tokens, only a final delta with finish_reason "abort".
Each backend's stream loop checks `ActiveRequest.aborted` before yielding and waits on
`ActiveRequest.abort_event` while it would otherwise sleep (replay timing, network reads).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from specgen.engines.base import EngineError, TokenDelta


@dataclass
class ActiveRequest:
    request_id: str
    kind: str                                   # "reason" | "fork": named in errors
    abort_event: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def aborted(self) -> bool:
        return self.abort_event.is_set()

    def abort_delta(self) -> TokenDelta:
        return TokenDelta(token_ids=[], text="", t=time.monotonic(), finished=True, finish_reason="abort")


class ActiveRequests:
    """The generations a backend is running, by request id."""

    def __init__(self, engine_name: str) -> None:
        self._engine_name = engine_name
        self._by_id: dict[str, ActiveRequest] = {}

    def open(self, request_id: str, kind: str) -> ActiveRequest:
        if not isinstance(request_id, str) or not request_id:
            raise EngineError(f"{self._engine_name}: request_id must be a non-empty string, got {request_id!r}")
        if request_id in self._by_id:
            raise EngineError(
                f"{self._engine_name}: request id {request_id!r} is already running; "
                "give every reason()/fork() call its own id"
            )
        request = ActiveRequest(request_id, kind)
        self._by_id[request_id] = request
        return request

    def close(self, request: ActiveRequest) -> None:
        if self._by_id.get(request.request_id) is request:
            del self._by_id[request.request_id]

    def mark_aborted(self, request_id: str) -> ActiveRequest | None:
        request = self._by_id.get(request_id)
        if request is not None:
            request.abort_event.set()
        return request

    def ids(self) -> list[str]:
        return list(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)


def check_prompt_ids(engine_name: str, what: str, ids: list[int]) -> None:
    """Reject prompt pieces that are not lists of non-negative ints, naming the argument."""
    if not isinstance(ids, (list, tuple)):
        raise EngineError(f"{engine_name}: {what} must be a list of token ids, got {type(ids).__name__}")
    for position, token_id in enumerate(ids):
        if not isinstance(token_id, int) or isinstance(token_id, bool) or token_id < 0:
            raise EngineError(
                f"{engine_name}: {what}[{position}] = {token_id!r} is not a token id (non-negative int)"
            )


def check_params(engine_name: str, params: object) -> None:
    from specgen.engines.base import GenerationParams

    if not isinstance(params, GenerationParams):
        raise EngineError(f"{engine_name}: params must be a GenerationParams, got {type(params).__name__}")
    if not isinstance(params.max_tokens, int) or params.max_tokens < 1:
        raise EngineError(f"{engine_name}: GenerationParams.max_tokens must be >= 1, got {params.max_tokens!r}")
    if params.temperature < 0:
        raise EngineError(f"{engine_name}: GenerationParams.temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise EngineError(f"{engine_name}: GenerationParams.top_p must be in (0, 1], got {params.top_p}")


def check_fork_args(engine_name: str, prompt_ids: list[int], reasoning_ids: list[int],
                    suffix_ids: list[int], params: object) -> None:
    """The checks every backend's `fork` makes before it starts."""
    check_prompt_ids(engine_name, "prompt_ids", prompt_ids)
    check_prompt_ids(engine_name, "reasoning_ids", reasoning_ids)
    check_prompt_ids(engine_name, "suffix_ids", suffix_ids)
    check_params(engine_name, params)
