from pathlib import Path

import msgspec

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


def test_a_jobs_owner_is_kept_and_an_older_journal_gets_the_column(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite3"
    old = sqlite3.connect(path)     # the jobs table as journals had it before owners were kept
    old.execute("CREATE TABLE jobs (job_id TEXT PRIMARY KEY, spec BLOB NOT NULL, state TEXT NOT NULL, "
                "has_reasoner INTEGER NOT NULL, attempts INTEGER NOT NULL, result BLOB)")
    old.execute("INSERT INTO jobs VALUES ('OLD', ?, 'running', 1, 1, NULL)",
                (msgspec.msgpack.encode(JobSpec(job_id="OLD")),))
    old.commit()
    old.close()
    j = Journal(path)
    assert j.job("OLD").owner == ""                  # nobody's: only its reasoner and the admin
    j.put_job(JobSpec(job_id="NEW"), "running", False, 0, owner="key:abc")
    j.commit()
    j.close()
    j2 = Journal(path)
    assert j2.job("NEW").owner == "key:abc"
    assert {r.spec.job_id: r.owner for r in j2.unfinished_jobs()} == {"OLD": "", "NEW": "key:abc"}
