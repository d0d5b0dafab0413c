"""A suite's job: the optimize loop as a scheduler job (optimize/job.py's entry), with every turn
of its reasoning recorded as a trace that `specgen bench` and `specgen optimize --llm replay` can
replay.

The job's engine is the one `run_scheduled_job` would build; its `chat_prompt_ids`, `reason` and
`fork` are wrapped on the instance (not by a wrapper class, so that what the loop and the KV pool
check of the engine's type still holds) to keep what they streamed: per reasoning stream its
chunks as they arrived, timed from the request's start as `traces/recorder.py` times them, and
split at the think-end tag into reasoning and answer by the recorder's own `_split_at_think_end`;
per fork its position and completion. The trace travels back in the job's result (`summary`,
key `TRACE_KEY`), so the client writes it into its own results folder wherever the cluster runs.

A turn is kept only when its reasoning reached its end (finish "stop" or "length"): an aborted
one (the loop stopped it early, or the job was cut) is not a turn another run could replay. In
best-of-n each iteration's first stream is its turn. The entry must be among the scheduler's
`job_entries` (`ENTRY`); a suite's local cluster lists it.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specgen.messages import JobEvent, JobResult, JobSpec

ENTRY = "specgen.optimize.suite_job:run_recorded_job"
RECORD_OPTION = "record_trace"        # options key: {"model": label, "notes": text}, or absent
TRACE_KEY = "trace"                   # in JobResult.summary: the trace as Trace.to_json() gives it

_STREAM = re.compile(r"/it(\d+)/reason(\d*)$")
_FORK = re.compile(r"/it(\d+)/")


class TurnRecorder:
    """Keeps what an engine streams, and makes a trace of it."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.chats: dict[tuple[int, ...], list[dict[str, str]]] = {}
        self.streams: dict[int, tuple[list[dict[str, str]] | None, list[Any], str | None]] = {}
        self.forks: dict[int, list[tuple[int, list[Any], str]]] = {}
        self._wrap()

    def _wrap(self) -> None:
        from specgen.traces.recorder import _TimedSegment

        engine = self.engine
        chat_prompt_ids, reason, fork = engine.chat_prompt_ids, engine.reason, engine.fork

        def recording_chat(messages: list[dict[str, str]]) -> list[int]:
            ids = chat_prompt_ids(messages)
            self.chats[tuple(ids)] = [dict(m) for m in messages]
            return ids

        async def recording_reason(request_id: str, prompt_ids: list[int], params: Any):
            match = _STREAM.search(request_id)
            segment = _TimedSegment(time.monotonic())
            finish = None
            try:
                async for delta in reason(request_id, prompt_ids, params):
                    segment.add(delta)
                    if delta.finished:
                        finish = delta.finish_reason
                    yield delta
            finally:
                if match and match.group(2) in ("", "0") and int(match.group(1)) not in self.streams:
                    self.streams[int(match.group(1))] = (self.chats.get(tuple(prompt_ids)),
                                                         segment.chunks, finish)

        async def recording_fork(request_id: str, prompt_ids: list[int], reasoning_ids: list[int],
                                 suffix_ids: list[int], params: Any):
            match = _FORK.search(request_id)
            segment = _TimedSegment(time.monotonic())
            finish = None
            try:
                async for delta in fork(request_id, prompt_ids, reasoning_ids, suffix_ids, params):
                    segment.add(delta)
                    if delta.finished:
                        finish = delta.finish_reason
                    yield delta
            finally:
                if match and finish in ("stop", "length"):
                    self.forks.setdefault(int(match.group(1)), []).append(
                        (len(reasoning_ids), segment.chunks, engine.decode(list(suffix_ids))))

        engine.chat_prompt_ids, engine.reason, engine.fork = recording_chat, recording_reason, recording_fork

    def trace(self, problem: str, model: str, notes: str) -> Any | None:
        """The trace of the turns that ran to their end, in iteration order (None: none did)."""
        import datetime

        from specgen.traces.format import ForkRecording, Iteration, Segment, Trace, TraceMetadata
        from specgen.traces.recorder import PIECES_KIND, _split_at_think_end, tokenizer_spec_of

        engine = self.engine
        think_end_ids = engine.encode(engine.think_end)
        turns: list[Iteration] = []
        for index in sorted(self.streams):
            messages, chunks, finish = self.streams[index]
            if finish not in ("stop", "length"):
                continue
            reasoning, final = _split_at_think_end(engine, chunks, think_end_ids)
            forks = sorted((ForkRecording(position=p, completion=Segment(c), suffix_text=s)
                            for p, c, s in self.forks.get(index, []) if p <= reasoning.num_tokens),
                           key=lambda f: f.position)
            turns.append(Iteration(reasoning=reasoning, final=final, forks=forks, messages=messages))
        if not turns:
            return None
        tokenizer = tokenizer_spec_of(engine)
        vocab = engine.trace.vocab if tokenizer.get("kind") == PIECES_KIND else None
        skipped = len(self.streams) - len(turns)
        metadata = TraceMetadata(
            model=model, tokenizer=tokenizer, hand_written=False, problem=problem,
            notes=notes + (f"; {skipped} turn(s) cut before their end not kept" if skipped else ""),
            think_end=engine.think_end, timing="recorded",
            created=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        return Trace(metadata=metadata, iterations=turns, vocab=vocab)


async def run_recorded_job(job: JobSpec, backend: Any, emit: Callable[[JobEvent], None],
                           run_dir: Path | None = None) -> JobResult:
    """`optimize.job.run_scheduled_job`, with the engine's turns recorded (module docstring)."""
    import logging

    import msgspec

    from specgen.optimize import engine_kinds, job as optimize_job

    options = dict(job.options)
    record = options.pop(RECORD_OPTION, None)
    plain = msgspec.structs.replace(job, options=options, entry=optimize_job.ENTRY)
    recorders: list[TurnRecorder] = []
    build = getattr(engine_kinds.build_engine, "original", engine_kinds.build_engine)

    def build_recorded(*args: Any, **kwargs: Any) -> Any:
        # Put back at once: in a cluster of this process (`inprocess`) several jobs share the
        # module, and only this job's engine is this job's to record.
        engine_kinds.build_engine = build
        engine = build(*args, **kwargs)
        if record is not None:
            recorders.append(TurnRecorder(engine))
        return engine

    build_recorded.original = build   # type: ignore[attr-defined]
    # The job's own entry builds its engine by name from this module, before its first await,
    # so no other job's build comes in between.
    engine_kinds.build_engine = build_recorded
    try:
        result = await optimize_job.run_scheduled_job(plain, backend, emit, run_dir=run_dir)
    finally:
        engine_kinds.build_engine = build
    if record is not None and recorders:
        try:
            trace = recorders[0].trace(job.problem_name, str(record.get("model") or ""),
                                       str(record.get("notes") or ""))
            if trace is not None:
                result.summary[TRACE_KEY] = trace.to_json()
        except Exception as exc:   # a trace that cannot be made must not lose the job's result
            logging.getLogger("specgen.optimize.suite_job").warning(
                "job %s: no trace recorded: %s", job.job_id, exc)
    return result
