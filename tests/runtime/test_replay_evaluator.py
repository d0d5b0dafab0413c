import threading
import time
from pathlib import Path

import pytest

from specgen.errors import UsageError
from specgen.messages import CandidateSubmission
from specgen.runtime.replay_evaluator import Recording, ReplayEvaluator, ReplaySample, directive, write_recording


def sub(cid: str, source: str = "x") -> CandidateSubmission:
    return CandidateSubmission(job_id="j", candidate_id=cid, problem_name="p", problem_source="",
                               candidate_source=source)


def test_directive_sets_times_and_outcome() -> None:
    ev = ReplayEvaluator()
    src = directive(ReplaySample(validate_s=0.05, correct=True, profile_s=0.02, speedup=2.5)) + "code"
    started = time.monotonic()
    v = ev.run(sub("a", src), "full")
    assert time.monotonic() - started >= 0.07
    assert v.correct and v.speedup == 2.5 and "replayed" in v.flags
    bad = ev.run(sub("b", directive(ReplaySample(validate_s=0.0, correct=False))), "validate")
    assert not bad.correct and bad.error


def test_recording_samples_are_stable_per_candidate(tmp_path: Path) -> None:
    rec = Recording(source="test", samples=[ReplaySample(validate_s=0.0, correct=i % 2 == 0, profile_s=0.0,
                                                        speedup=float(i + 1)) for i in range(7)])
    write_recording(tmp_path / "r.json", rec)
    ev = ReplayEvaluator.from_spec(f"replay:{tmp_path / 'r.json'}")
    first = [ev.run(sub(f"c{i}"), "full").speedup for i in range(20)]
    assert first == [ev.run(sub(f"c{i}"), "full").speedup for i in range(20)]
    assert len(set(first)) > 1
    with pytest.raises(UsageError, match="cannot read replay recording"):
        ReplayEvaluator.from_spec(f"replay:{tmp_path / 'missing.json'}")
    assert "no replay directive" in (ReplayEvaluator().run(sub("z"), "validate").error or "")


def test_cancel_interrupts_a_replay() -> None:
    ev = ReplayEvaluator()
    threading.Timer(0.1, ev.cancel).start()
    v = ev.run(sub("slow", directive(ReplaySample(validate_s=30.0))), "validate")
    assert v.error and v.error.startswith("cancelled")
