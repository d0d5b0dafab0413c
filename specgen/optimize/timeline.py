"""A job's history as a Chrome/Perfetto trace (open `timeline.json` in ui.perfetto.dev or
chrome://tracing).

Process "generation": one row per reasoning stream and as many fork rows as forks ever overlapped
(each fork is one span, laid on the first free row). Process "evaluation": one row per worker,
validation and profiling spans on it. Instant events mark candidates found, duplicates and
terminations. Times are microseconds from the job's start.
"""
from __future__ import annotations

from typing import Any

from specgen.messages import CandidateUpdate, OptimizeResult

GENERATION_PID = 1
EVALUATION_PID = 2


def _us(t: float, t0: float) -> float:
    return round((t - t0) * 1e6, 1)


def _lanes(spans: list[tuple[float, float]]) -> list[int]:
    """A row per span such that spans on one row never overlap (greedy, in start order)."""
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    lane_end: list[float] = []
    lanes = [0] * len(spans)
    for i in order:
        start, end = spans[i]
        for lane, busy_until in enumerate(lane_end):
            if busy_until <= start:
                lanes[i], lane_end[lane] = lane, end
                break
        else:
            lanes[i] = len(lane_end)
            lane_end.append(end)
    return lanes


def _verdict_args(update: CandidateUpdate) -> dict[str, Any]:
    verdict = update.verdict
    args: dict[str, Any] = {"candidate": update.candidate_id, "stage": update.stage,
                            "compiled": verdict.compiled, "correct": verdict.correct,
                            "device": verdict.device, "cancelled": update.cancelled}
    if verdict.speedup is not None:
        args["speedup"] = round(verdict.speedup, 4)
    if verdict.error:
        args["error"] = verdict.error[:300]
    if verdict.flags:
        args["flags"] = verdict.flags
    return args


def build_timeline(result: OptimizeResult) -> dict[str, Any]:
    """The trace as a JSON-ready dict in the Trace Event Format."""
    t0 = result.started_at
    end = result.finished_at or t0
    events: list[dict[str, Any]] = []

    def meta(pid: int, tid: int | None, key: str, name: str) -> None:
        event: dict[str, Any] = {"name": key, "ph": "M", "pid": pid, "args": {"name": name}}
        if tid is not None:
            event["tid"] = tid
        events.append(event)

    def span(pid: int, tid: int, name: str, cat: str, start: float, stop: float,
             args: dict[str, Any]) -> None:
        events.append({"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid,
                       "ts": _us(start, t0), "dur": round(max(0.0, _us(stop, t0) - _us(start, t0)), 1),
                       "args": args})

    meta(GENERATION_PID, None, "process_name", f"generation ({result.engine or 'engine'})")
    meta(EVALUATION_PID, None, "process_name", "evaluation")

    # Reasoning streams: rows 1..n.
    for row, stream in enumerate(result.reasoning, start=1):
        meta(GENERATION_PID, row, "thread_name", f"reasoning {stream.request_id}")
        span(GENERATION_PID, row, f"reasoning it{stream.iteration}", "reasoning",
             stream.started_at, stream.finished_at or end,
             {"request_id": stream.request_id, "tokens": stream.tokens,
              "finish_reason": stream.finish_reason})
    fork_base = len(result.reasoning) + 1

    # Forks: as few rows as their overlap allows.
    fork_spans = [(f.started_at, f.finished_at or end) for f in result.forks]
    lanes = _lanes(fork_spans)
    for lane in sorted(set(lanes)):
        meta(GENERATION_PID, fork_base + lane, "thread_name", f"forks {lane}")
    for fork, lane, (start, stop) in zip(result.forks, lanes, fork_spans):
        span(GENERATION_PID, fork_base + lane, f"fork it{fork.iteration} @{fork.position}", "fork",
             start, stop,
             {"request_id": fork.request_id, "trigger": fork.trigger, "outcome": fork.outcome,
              "tokens": fork.tokens, "prompt_tokens": fork.prompt_tokens,
              "cached_tokens": fork.cached_tokens, "candidate": fork.candidate_id})

    # Evaluation: a row per worker.
    worker_rows: dict[str, int] = {}
    for record in result.candidates:
        for update in (record.validation, record.profile):
            if update is None or update.started_at <= 0:
                continue
            worker = update.worker or "unknown worker"
            if worker not in worker_rows:
                worker_rows[worker] = len(worker_rows) + 1
                meta(EVALUATION_PID, worker_rows[worker], "thread_name", worker)
            stage = "validate" if update.stage == "validate" else (
                "profile" if update.stage == "profile" else "evaluate")
            span(EVALUATION_PID, worker_rows[worker], f"{stage} {record.candidate_id}", stage,
                 update.started_at, max(update.finished_at, update.started_at),
                 _verdict_args(update))

    # Instants: candidates found (on the row of the stream or fork that wrote them).
    row_of_request = {s.request_id: row for row, s in enumerate(result.reasoning, start=1)}
    row_of_request.update({f.request_id: fork_base + lane
                           for f, lane in zip(result.forks, lanes)})
    for record in result.candidates:
        name = (f"duplicate {record.candidate_id} of {record.duplicate_of}"
                if record.duplicate_of else f"candidate {record.candidate_id} ({record.origin})")
        events.append({"name": name, "cat": "candidate", "ph": "i", "s": "t",
                       "pid": GENERATION_PID, "tid": row_of_request.get(record.request_id, 1),
                       "ts": _us(record.extracted_at, t0),
                       "args": {"status": record.status, "speedup": record.speedup,
                                "position": record.position}})
    for iteration in result.iterations:
        if iteration.finished_at is not None and iteration.stop_reason:
            events.append({"name": f"iteration {iteration.index} ends: {iteration.stop_reason}",
                           "cat": "termination", "ph": "i", "s": "g", "pid": GENERATION_PID,
                           "tid": 1, "ts": _us(iteration.finished_at, t0), "args": {}})
    events.append({"name": f"job ends: {result.status}", "cat": "termination", "ph": "i",
                   "s": "g", "pid": GENERATION_PID, "tid": 1, "ts": _us(end, t0),
                   "args": {"stop_reason": result.stop_reason,
                            "best_speedup": result.best_speedup}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"job_id": result.job_id, "mode": result.mode,
                          "problem": result.problem_name, "started_at": t0}}
