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


def test_a_run_folder_its_files_and_its_journal_are_private(tmp_path) -> None:
    """Folders 0700 and files 0600, whatever the umask (a run holds every candidate's source)."""
    import os
    import stat

    from specgen.messages import OptimizeSpec
    from specgen.optimize.outputs import JOURNAL_DIR, LoopJournal, write_run_settings

    def mode(path):
        return stat.S_IMODE(path.stat().st_mode)

    out = tmp_path / "specgen-runs" / "run"
    old = os.umask(0)          # the loosest: nothing of the modes may come from it
    try:
        write_run_settings(out, {"mode": "specgen"}, OptimizeSpec(job_id="j", problem_name="p",
                                                                  problem_source="x"))
        LoopJournal(out).close()
        writer = RunWriter(out)
        writer(OptimizeEvent(job_id="j", kind="job_started", t=1.0, progress=JobProgress()))
        writer.finish(OptimizeResult(job_id="j", problem_name="p", mode="specgen", status="succeeded",
                                     best_source="class ModelNew: pass\n", started_at=1.0, finished_at=2.0))
    finally:
        os.umask(old)
    for folder in (tmp_path / "specgen-runs", out, out / JOURNAL_DIR):
        assert mode(folder) == 0o700, folder
    for name in ("events.jsonl", "result.json", "best_kernel.py", "timeline.json",
                 f"{JOURNAL_DIR}/run.json", f"{JOURNAL_DIR}/loop.jsonl"):
        assert mode(out / name) == 0o600, name
