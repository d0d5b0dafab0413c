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


def _pool_stats():
    from specgen.messages import KvPoolStats

    return KvPoolStats(pool_id="p", capacity_bytes=3 << 30, slot_bytes=1 << 20, hits=75, misses=25,
                       hit_rate=0.75, stores=1024, loads=512, evictions=17)


def test_kv_pool_figures_read_hit_rate_bytes_moved_evictions_and_memory_lent() -> None:
    from specgen.optimize.progress import kv_pool_part

    assert kv_pool_part(_pool_stats()) == \
        "KV pool hit 75% of 100 | moved 1.5 GiB | evicted 17 | lent 3.0 GiB"
    from specgen.messages import KvPoolStats

    assert kv_pool_part(KvPoolStats()) == "KV pool hit - | moved 0 B | evicted 0 | lent 0 B"


def test_the_status_carries_the_pool_once_its_source_has_figures() -> None:
    latest = {"stats": None}
    out = io.StringIO()
    display = ProgressDisplay(out, live=False, kv_pool=lambda: latest["stats"])
    display(event("iteration_finished", reason="it 1"))
    assert "KV pool" not in out.getvalue()          # no report yet: no pool figures
    latest["stats"] = _pool_stats()
    display(event("iteration_finished", reason="it 2"))
    display.close()
    last = out.getvalue().splitlines()[-1]
    assert "best 1.80x | KV pool hit 75% of 100 | moved 1.5 GiB | evicted 17 | lent 3.0 GiB" in last


def test_live_line_shows_the_pool_and_the_poller_reads_the_schedulers_view() -> None:
    import time
    from types import SimpleNamespace

    from specgen.messages import KvPoolView
    from specgen.optimize.kv_pool import LiveKvStats

    view = KvPoolView(pool="p", stats=_pool_stats())
    backend = SimpleNamespace(client=SimpleNamespace(stats=lambda: SimpleNamespace(kv_pools=[view])))
    source = LiveKvStats(backend, "p", interval_s=0.01)
    try:
        deadline = time.monotonic() + 5
        while source() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        out = io.StringIO()
        display = ProgressDisplay(out, live=True, kv_pool=source)
        display(event("termination", reason="done"))
        display.close()
        assert "lent 3.0 GiB" in out.getvalue()
    finally:
        source.close()
