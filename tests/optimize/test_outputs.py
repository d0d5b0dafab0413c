from __future__ import annotations

import msgspec

from specgen.messages import JobProgress, OptimizeEvent, OptimizeResult
from specgen.optimize.outputs import RunWriter

from .chrome_trace import load_chrome_trace


def test_events_are_written_live_and_the_rest_at_the_end(tmp_path) -> None:
    writer = RunWriter(tmp_path / "out")
    writer(OptimizeEvent(job_id="j", kind="job_started", t=1.0, progress=JobProgress()))
    # Already on disk while the job runs: a run that dies still leaves its story.
    assert (tmp_path / "out" / "events.jsonl").read_text().count("\n") == 1
    result = OptimizeResult(job_id="j", problem_name="p", mode="sequential", status="failed",
                            error="engine unreachable", started_at=1.0, finished_at=2.0)
    written = writer.finish(result)
    assert set(written) == {"events", "result", "timeline"}   # no correct kernel, no kernel file
    assert not (tmp_path / "out" / "best_kernel.py").exists()
    back = msgspec.json.decode((tmp_path / "out" / "result.json").read_bytes(),
                               type=OptimizeResult)
    assert back == result
    load_chrome_trace(written["timeline"])
    writer(OptimizeEvent(job_id="j", kind="late", t=3.0))     # after finish: ignored
    assert (tmp_path / "out" / "events.jsonl").read_text().count("\n") == 1
