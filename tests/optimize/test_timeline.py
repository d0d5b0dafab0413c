from __future__ import annotations

import json

from specgen.messages import (
    CandidateRecord,
    CandidateUpdate,
    ForkRecord,
    IterationRecord,
    OptimizeResult,
    ReasoningRecord,
    Verdict,
)
from specgen.optimize.timeline import build_timeline

from .chrome_trace import load_chrome_trace

T0 = 1_800_000_000.0


def history() -> OptimizeResult:
    forks = [ForkRecord(request_id=f"j/it0/fork{i}", iteration=0, position=100 * (i + 1),
                        trigger="cue: wait", started_at=T0 + s, finished_at=T0 + e,
                        outcome="candidate", candidate_id=f"c00{i}")
             for i, (s, e) in enumerate([(1, 4), (2, 3), (2.5, 5), (4, 6)])]
    updates = [
        CandidateUpdate(job_id="j", candidate_id="c000", stage="validate",
                        verdict=Verdict(compiled=True, correct=True), worker="node/cpu0",
                        started_at=T0 + 4, finished_at=T0 + 5),
        CandidateUpdate(job_id="j", candidate_id="c000", stage="profile",
                        verdict=Verdict(compiled=True, correct=True, speedup=2.0),
                        worker="node/cpu1", started_at=T0 + 5, finished_at=T0 + 7),
    ]
    record = CandidateRecord(candidate_id="c000", iteration=0, origin="fork",
                             request_id="j/it0/fork0", position=100, fingerprint="f",
                             source="s", extracted_at=T0 + 4, status="correct",
                             validation=updates[0], profile=updates[1], feedback_at=T0 + 7)
    dup = CandidateRecord(candidate_id="c001", iteration=0, origin="fork",
                          request_id="j/it0/fork1", position=200, fingerprint="f", source="s",
                          extracted_at=T0 + 3, status="duplicate", duplicate_of="c000")
    return OptimizeResult(
        job_id="j", problem_name="p", mode="specgen", status="target_reached", engine="replay",
        started_at=T0, finished_at=T0 + 8,
        iterations=[IterationRecord(index=0, started_at=T0, finished_at=T0 + 7.5,
                                    stop_reason="early termination")],
        reasoning=[ReasoningRecord(request_id="j/it0/reason", iteration=0, started_at=T0,
                                   finished_at=T0 + 7.5, tokens=900, finish_reason="abort")],
        forks=forks, candidates=[record, dup])


def test_timeline_is_a_valid_chrome_trace(tmp_path) -> None:
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(build_timeline(history())))
    events = load_chrome_trace(path)
    spans = [e for e in events if e["ph"] == "X"]
    names = {e["name"] for e in spans}
    assert "reasoning it0" in names and {"validate c000", "profile c000"} <= names
    # Overlapping forks go to different rows; the checker verified that rows nest.
    fork_rows = {e["tid"] for e in spans if e["cat"] == "fork"}
    assert len(fork_rows) == 3           # (1-4), (2-3), (2.5-5) overlap; (4-6) reuses a row
    workers = {e["args"]["name"] for e in events if e["ph"] == "M" and e["pid"] == 2
               and e["name"] == "thread_name"}
    assert workers == {"node/cpu0", "node/cpu1"}
    profile = next(e for e in spans if e["name"] == "profile c000")
    assert profile["ts"] == 5e6 and profile["dur"] == 2e6
    assert profile["args"]["speedup"] == 2.0
    instants = [e["name"] for e in events if e["ph"] == "i"]
    assert "duplicate c001 of c000" in instants and "job ends: target_reached" in instants
