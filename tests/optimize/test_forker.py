"""The forker alone: a fake engine, a candidate callback, no job, no sockets, no backend."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from specgen.engines.base import Engine, GenerationParams, TokenDelta
from specgen.messages import CandidateRecord
from specgen.optimize.dedup import Deduplicator
from specgen.optimize.fork_prompt import FORK_INSTRUCTION, FORK_STOP
from specgen.optimize.forker import Forker, ForkTally
from specgen.optimize.triggers import (
    EveryNTokens,
    InlineCodeBlock,
    MaxForksPerIteration,
    MinGap,
    TriggerPolicy,
)

PROGRAM = ("import torch\n\n\nclass ModelNew(torch.nn.Module):\n"
           "    def forward(self, x):\n        return x * 2\n")
# The same program as far as evaluation is concerned: only a comment and blank lines differ.
PROGRAM_AGAIN = ("import torch\n# doubled\n\nclass ModelNew(torch.nn.Module):\n\n"
                 "    def forward(self, x):\n        return x * 2  # same\n")
OTHER = ("import torch\n\n\nclass ModelNew(torch.nn.Module):\n"
         "    def forward(self, x):\n        return x + x\n")


class FakeEngine(Engine):
    """One character per token, so ids are easy to write and to check. Each fork writes the next
    of `outputs` and closes the fence; with `hold` a fork writes nothing until it is cancelled."""

    name = "fake"

    def __init__(self, outputs: list[str] | None = None, *, hold: bool = False) -> None:
        self.outputs = list(outputs or [PROGRAM])
        self.hold = hold
        self.fork_calls: list[tuple[str, list[int], list[int], list[int], GenerationParams]] = []
        self.aborted: list[str] = []
        self.closed: list[str] = []

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: list[int]) -> str:
        return "".join(map(chr, token_ids))

    def chat_prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return self.encode("".join(m["content"] for m in messages))

    def reason(self, request_id: str, prompt_ids: list[int],
               params: GenerationParams) -> AsyncIterator[TokenDelta]:
        raise AssertionError("a forker never streams reasoning")

    def fork(self, request_id: str, prompt_ids: list[int], reasoning_ids: list[int],
             suffix_ids: list[int], params: GenerationParams) -> AsyncIterator[TokenDelta]:
        # Copies: what the engine was handed at this moment, whatever happens to the lists later.
        self.fork_calls.append((request_id, list(prompt_ids), list(reasoning_ids),
                                list(suffix_ids), params))
        text = self.outputs[(len(self.fork_calls) - 1) % len(self.outputs)]
        return self._stream(request_id, text)

    async def _stream(self, request_id: str, text: str) -> AsyncIterator[TokenDelta]:
        try:
            if self.hold:
                await asyncio.Event().wait()
            yield TokenDelta(self.encode(text), text, 0.0, num_prompt_tokens=7,
                             num_cached_tokens=5)
            yield TokenDelta(self.encode("\n```"), "\n```", 0.0, finished=True,
                             finish_reason="stop")
        finally:
            self.closed.append(request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


class Sink:
    """The job's side of the callback: numbers candidates and drops duplicates, as the loop does."""

    def __init__(self) -> None:
        self.dedup = Deduplicator()
        self.records: list[CandidateRecord] = []

    def __call__(self, source: str, origin: str, request_id: str,
                 position: int) -> CandidateRecord:
        candidate_id = f"c{len(self.records):03d}"
        admission = self.dedup.admit(source, candidate_id)
        record = CandidateRecord(candidate_id=candidate_id, iteration=0, origin=origin,
                                 request_id=request_id, position=position,
                                 fingerprint=admission.fingerprint, source=source,
                                 extracted_at=0.0, duplicate_of=admission.duplicate_of)
        self.records.append(record)
        return record


def make_forker(engine: FakeEngine, policy: TriggerPolicy, sink=None, **kw) -> tuple[Forker, list]:
    events: list[tuple[str, dict]] = []
    forker = Forker(engine, policy, iteration=3, request_prefix="job/it3",
                    prompt_ids=[1, 2, 3], on_candidate=sink or Sink(), fork_max_tokens=99,
                    emit=lambda kind, **fields: events.append((kind, fields)), **kw)
    return forker, events


async def feed(forker: Forker, text: str, request_id: str = "job/it3/reason") -> list[int]:
    """Stream `text` into the forker one token (character) per delta, as the loop does."""
    ids: list[int] = []
    so_far = ""
    for ch in text:
        previous_tokens, previous_len = len(ids), len(so_far)
        ids.append(ord(ch))
        so_far += ch
        forker.at_delta(request_id, ids, so_far, previous_len, previous_tokens)
        await asyncio.sleep(0)
    return ids


async def settle(forker: Forker) -> None:
    while forker.tasks:
        await asyncio.gather(*forker.tasks, return_exceptions=True)


def test_forks_fire_at_the_policys_points_and_a_gate_vetoes_one() -> None:
    async def go():
        engine = FakeEngine([PROGRAM, OTHER])
        policy = TriggerPolicy([EveryNTokens(4)], [MinGap(0), MaxForksPerIteration(2)])
        forker, events = make_forker(engine, policy)
        await feed(forker, "abcdefghijklm")
        await settle(forker)
        return engine, forker, events

    engine, forker, events = asyncio.run(go())
    assert [f.position for f in forker.forks] == [4, 8]
    assert [f.request_id for f in forker.forks] == ["job/it3/fork0", "job/it3/fork1"]
    assert [f.trigger for f in forker.forks] == ["every_n_tokens: 4 tokens",
                                                 "every_n_tokens: 8 tokens"]
    assert forker.tally.forks == forker.forks and forker.tally.fork_count == 2
    assert forker.tally.forks_skipped == 1
    assert forker.last_fork_position == 8
    kinds = [(kind, fields.get("position")) for kind, fields in events]
    assert ("fork_started", 4) in kinds and ("fork_started", 8) in kinds
    skipped = [fields for kind, fields in events if kind == "fork_skipped"]
    assert len(skipped) == 1 and skipped[0]["position"] == 12
    assert skipped[0]["reason"].startswith("every_n_tokens (12 tokens) vetoed by max_forks")


def test_fork_prompt_is_built_from_exact_token_ids() -> None:
    async def go():
        engine = FakeEngine()
        forker, _ = make_forker(engine, TriggerPolicy([EveryNTokens(5)], [MinGap(0)]))
        ids = await feed(forker, "héllo wörld")
        await settle(forker)
        return engine, ids

    engine, ids = asyncio.run(go())
    assert len(engine.fork_calls) == 2
    (rid0, prompt0, reasoning0, suffix0, params), (_, _, reasoning1, suffix1, _) = engine.fork_calls
    assert rid0 == "job/it3/fork0"
    assert prompt0 == [1, 2, 3]
    # The very ids the reasoning produced up to the trigger point, never re-tokenized text.
    assert reasoning0 == ids[:5] and reasoning1 == ids[:10]
    assert suffix0 == suffix1 == engine.encode("\n" + engine.think_end + FORK_INSTRUCTION)
    assert params.temperature == 0.0 and params.stop == list(FORK_STOP)
    assert params.max_tokens == 99


def test_a_forks_output_becomes_a_candidate_once() -> None:
    async def go():
        engine = FakeEngine([PROGRAM])
        sink = Sink()
        tally = ForkTally(fork_count=7)
        forker, events = make_forker(engine, TriggerPolicy([EveryNTokens(4)], [MinGap(0)]),
                                     sink=sink, tally=tally)
        await feed(forker, "abcdef")
        await settle(forker)
        return engine, sink, forker, events

    engine, sink, forker, events = asyncio.run(go())
    (fork,) = forker.forks
    assert fork.request_id == "job/it3/fork7"        # numbering carries on across streams
    assert len(sink.records) == 1
    record = sink.records[0]
    assert (record.origin, record.request_id, record.position) == ("fork", fork.request_id, 4)
    assert record.source.strip() == PROGRAM.strip()
    assert fork.outcome == "candidate" and fork.candidate_id == record.candidate_id
    assert (fork.prompt_tokens, fork.cached_tokens, fork.finish_reason) == (7, 5, "stop")
    assert fork.tokens == len(PROGRAM) + 4 and forker.tally.fork_tokens == fork.tokens
    assert fork.finished_at is not None
    assert forker.tally.recent_fork_yields == [True]
    assert [k for k, _ in events] == ["fork_started", "fork_finished"]
    assert events[1][1]["candidate_id"] == record.candidate_id
    assert events[1][1]["reason"] == "candidate"
    assert engine.closed == [fork.request_id] and not forker.requests


def test_a_duplicate_fork_is_recognized() -> None:
    async def go():
        engine = FakeEngine([PROGRAM, PROGRAM_AGAIN, "   \n"])
        sink = Sink()
        forker, events = make_forker(engine, TriggerPolicy([EveryNTokens(2)], [MinGap(0)]),
                                     sink=sink)
        await feed(forker, "abcdef")
        await settle(forker)
        return sink, forker, events

    sink, forker, events = asyncio.run(go())
    assert [f.outcome for f in forker.forks] == ["candidate", "duplicate", "no_code"]
    assert sink.records[1].duplicate_of == sink.records[0].candidate_id
    assert forker.forks[1].candidate_id == sink.records[1].candidate_id
    assert len(sink.records) == 2                  # nothing to hand over from an empty fork
    # Only a new program counts as a yield (the load-aware gate backs off on barren forks).
    assert forker.tally.recent_fork_yields == [True, False, False]
    finished = [f["reason"] for k, f in events if k == "fork_finished"]
    assert finished == ["candidate", "duplicate", "no_code"]


def test_a_program_written_in_the_reasoning_is_a_candidate_without_a_fork() -> None:
    reasoning = "Plan.\n```python\n" + PROGRAM + "```\nmore"

    async def go():
        engine = FakeEngine()
        sink = Sink()
        forker, _ = make_forker(engine, TriggerPolicy([InlineCodeBlock()], [MinGap(0)]),
                                sink=sink)
        ids = await feed(forker, reasoning)
        forker.finish("job/it3/reason", reasoning, len(ids))
        await settle(forker)
        return engine, sink, forker

    engine, sink, forker = asyncio.run(go())
    assert not engine.fork_calls and not forker.forks
    (record,) = sink.records
    assert record.origin == "inline" and record.request_id == "job/it3/reason"
    assert forker.last_fork_position == record.position > 0


def test_cancel_stops_forks_in_flight() -> None:
    async def go():
        engine = FakeEngine(hold=True)
        sink = Sink()
        forker, events = make_forker(engine, TriggerPolicy([EveryNTokens(2)], [MinGap(0)]),
                                     sink=sink)
        await feed(forker, "abcd")
        await asyncio.sleep(0)
        running = (len(forker.tasks), set(forker.requests))
        await forker.cancel()
        return engine, sink, forker, events, running

    engine, sink, forker, events, running = asyncio.run(go())
    assert running == (2, {"job/it3/fork0", "job/it3/fork1"})
    assert not forker.tasks and not forker.requests and not sink.records
    assert all((f.outcome, f.finish_reason) == ("aborted", "abort") and f.finished_at is not None
               for f in forker.forks)
    assert sorted(engine.closed) == ["job/it3/fork0", "job/it3/fork1"]
    assert forker.tally.recent_fork_yields == []    # an aborted fork says nothing about yields
    assert [f["reason"] for k, f in events if k == "fork_finished"] == ["aborted", "aborted"]


def test_no_fork_once_stopped() -> None:
    async def go():
        engine = FakeEngine()
        forker, events = make_forker(engine, TriggerPolicy([EveryNTokens(2)], [MinGap(0)]),
                                     stopped=lambda: True)
        await feed(forker, "abcd")
        return engine, forker, events

    engine, forker, events = asyncio.run(go())
    assert not engine.fork_calls and not forker.forks and not events
