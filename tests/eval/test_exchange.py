"""The judge's requests to its runners: what a timing changes in the judge's own thread."""
from __future__ import annotations

import os
import threading

import pytest

from specgen.eval.exchange import _not_preempting


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")
def test_a_timing_runs_the_judges_thread_as_batch_and_restores_it() -> None:
    before = os.sched_getscheduler(0)
    asked, seen = threading.Event(), []
    other = threading.Thread(target=lambda: (asked.wait(), seen.append(os.sched_getscheduler(0))))
    other.start()                                   # one of the worker's other threads
    with _not_preempting():
        assert os.sched_getscheduler(0) == os.SCHED_BATCH
        asked.set()
        other.join()
    assert seen == [before]                         # this thread only
    assert os.sched_getscheduler(0) == before
    with pytest.raises(RuntimeError), _not_preempting():
        raise RuntimeError("a timing that stops")
    assert os.sched_getscheduler(0) == before
