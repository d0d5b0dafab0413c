from __future__ import annotations

import io

from specgen.messages import CandidateUpdate, JobProgress, OptimizeEvent, Verdict
from specgen.optimize.progress import ProgressDisplay, describe, status_line


def event(kind: str, **kw) -> OptimizeEvent:
    return OptimizeEvent(job_id="j", kind=kind, t=0.0,
                         progress=JobProgress(elapsed_s=3.5, iteration=1, reasoning_tokens=1234,
                                              forks=3, forks_running=1, validating=2,
                                              profiling=1, profiled=4, best_speedup=1.8), **kw)


def test_status_line_has_the_figures() -> None:
    line = status_line(event("x").progress)
    for part in ("3.5s", "1,234 tok", "forks 3 (1 running", "validating 2", "profiling 1",
                 "profiled 4", "best 1.80x"):
        assert part in line


def test_verdicts_read_as_sentences() -> None:
    failed = CandidateUpdate(job_id="j", candidate_id="c1", stage="validate", worker="n/cpu0",
                             verdict=Verdict(compiled=False, error="Traceback...\nNameError: tl"))
    fast = CandidateUpdate(job_id="j", candidate_id="c2", stage="profile",
                           verdict=Verdict(compiled=True, correct=True, speedup=2.5))
    assert describe(event("update", candidate_id="c1", update=failed)) == \
        "validate c1 on n/cpu0: does not compile/load: NameError: tl"
    assert describe(event("update", candidate_id="c2", update=fast)) == \
        "profile c2: correct, 2.50x (CPU timing)"
    assert describe(event("fork_skipped")) is None


def test_log_mode_prints_notable_events_with_the_status() -> None:
    out = io.StringIO()
    display = ProgressDisplay(out, live=False)
    display(event("fork_started", position=300, reason="cue: wait"))
    display(event("termination", reason="target_reached: c2 reached 2.5x"))
    display.close()
    text = out.getvalue()
    assert "fork at token" not in text          # frequent events stay out of a log
    assert "stop: target_reached" in text and "best 1.80x" in text


def test_live_mode_redraws_one_line() -> None:
    out = io.StringIO()
    display = ProgressDisplay(out, live=True)
    display(event("fork_started", position=300, reason="cue: wait"))
    display(event("candidate", candidate_id="c1", origin="fork", position=400))
    display.close()
    text = out.getvalue()
    assert text.count("\r\x1b[2K") == 1 and text.count("best 1.80x") == 2 and "fork at token 300" in text and text.endswith("\n")
