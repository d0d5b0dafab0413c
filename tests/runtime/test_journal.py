from pathlib import Path

from specgen.messages import CandidateSubmission, CandidateUpdate, JobEvent, JobResult, JobSpec, Verdict
from specgen.runtime.journal import Journal


def test_journal_survives_reopening_and_ignores_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    j = Journal(path)
    spec = JobSpec(job_id="J", problem_source="src", options={"k": [1, 2]})
    j.put_job(spec, "running", True, 1)
    sub = CandidateSubmission(job_id="J", candidate_id="c", problem_name="p", problem_source="s",
                              candidate_source="x")
    j.put_candidate(sub)
    j.put_candidate(sub)
    upd = CandidateUpdate(job_id="J", candidate_id="c", stage="validate", verdict=Verdict(correct=True))
    j.put_update(upd)
    j.put_update(CandidateUpdate(job_id="J", candidate_id="c", stage="validate", verdict=Verdict()))
    j.put_event(JobEvent(job_id="J", seq=1, kind="created"))
    j.put_event(JobEvent(job_id="J", seq=2, kind="verdict", data={"x": 1}))
    j.commit()
    j.put_event(JobEvent(job_id="J", seq=3, kind="never committed"))
    j.db.close()   # a crash: the open transaction is lost

    j2 = Journal(path)
    [rec] = j2.unfinished_jobs()
    assert rec.spec == spec and rec.attempts == 1 and rec.has_reasoner
    assert rec.candidates == [sub]
    assert rec.updates == [upd]                     # the first verdict for a key wins
    assert rec.last_seq == 2
    assert [e.kind for e in j2.events_after("J", 1)] == ["verdict"]
    j2.put_job(spec, "finished", True, 1, JobResult(job_id="J", status="succeeded"))
    j2.commit()
    assert j2.unfinished_jobs() == []
    assert j2.job("J").result.status == "succeeded"
    assert j2.counts("J") == (1, 1)
    assert j2.job("nope") is None
