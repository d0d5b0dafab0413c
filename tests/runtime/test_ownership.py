"""Whose a job is, through real sockets: the red team's attack by a second client, the stats a
plain client and the admin see, and ownership across a scheduler restart (with and without
CURVE). Verdicts come from replaying workers: what matters here is who gets which."""
from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from specgen.cli import main as cli_main
from specgen.messages import CandidateSubmission, GetJob, ResyncUpdates, SubmitAck, SubmitCandidate
from specgen.runtime import auth
from specgen.runtime.auth import generate, load_client_keys
from specgen.runtime.child_process import ChildProcess
from specgen.runtime.client import Client
from specgen.runtime.local import LocalCluster
from specgen.runtime.ownership import identity_of
from specgen.runtime.replay_evaluator import ReplaySample, directive
from specgen.runtime.settings import SETTINGS_ENV, RuntimeSettings
from specgen.runtime.transport import AuthenticationFailed, RemoteError

from tests.runtime.conftest import wait_for

ENTRY = "specgen.runtime.jobs:evaluate_candidates"
PROBLEM = "class Model:\n    pass\n"


def replayed(speedup: float, validate_s: float = 0.01) -> str:
    return directive(ReplaySample(validate_s=validate_s, correct=True, profile_s=0.01, speedup=speedup))


def submission(job_id: str, candidate_id: str, source: str) -> CandidateSubmission:
    return CandidateSubmission(job_id=job_id, candidate_id=candidate_id, problem_name="p",
                               problem_source=PROBLEM, candidate_source=source, profile=False)


def refused(call) -> RemoteError:   # type: ignore[no-untyped-def]
    with pytest.raises(RemoteError) as caught:
        call()
    return caught.value


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(workers=2, evaluator="replay") as c:
        yield c


def test_a_second_client_cannot_take_over_another_clients_job(cluster: LocalCluster) -> None:
    """The red team's attack: a plain client learns a job's id and submits its own program as the
    job's next candidate id, then tries to cancel, follow, read and resync the job. Each request
    is refused with not_owner; the victim's candidate keeps its own verdict, and its reasoner
    (which submits the candidates and reports the result) finishes the job."""
    with Client(cluster.address) as victim, Client(cluster.address) as attacker:
        job = victim.submit(PROBLEM, entry=ENTRY, options={
            "candidates": {"c000": replayed(2.0), "c001": replayed(3.0)}, "submit_interval_s": 1.0})
        forged = submission(job.job_id, "c001", replayed(99.0))
        err = refused(lambda: attacker.conn.request(SubmitCandidate(call_id=0, submission=forged)))
        assert err.code == "not_owner" and job.job_id in err.message and "CURVE key" in err.message
        for call in (lambda: attacker.cancel_job(job.job_id), lambda: attacker.job(job.job_id),
                     lambda: attacker.job_spec(job.job_id),
                     lambda: attacker.conn.request(ResyncUpdates(call_id=0, job_ids=[job.job_id]))):
            assert refused(call).code == "not_owner"
        assert job.job_id not in attacker._jobs        # nothing to re-subscribe after a restart
        result = job.result(timeout=60)
        events = list(job.events(timeout=10))
    assert result.status == "succeeded", result
    assert result.best_candidate_id == "c001" and result.best_verdict.speedup == 3.0
    verdicts = sorted((e.data["candidate_id"], e.data["stage"], e.data["speedup"])
                      for e in events if e.kind == "verdict")
    assert verdicts == [("c000", "profile", 2.0), ("c000", "validate", None),
                        ("c001", "profile", 3.0), ("c001", "validate", None)]
    assert cluster.client.stats().requests_not_owner >= 5


def test_stats_show_another_clients_jobs_to_the_admin_only(cluster: LocalCluster, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    with Client(cluster.address) as victim, Client(cluster.address) as other:
        job = victim.submit(PROBLEM, entry=ENTRY, options={"candidates": {"slow": replayed(2.0, 60.0)}})
        wanted = f"{job.job_id}/slow"
        wait_for(lambda: any(w.busy_candidate == wanted for w in cluster.client.stats().workers), 60,
                 "the job's candidate to run")
        theirs, mine, full = other.stats(), victim.stats(), cluster.client.stats()
        # The plain client sees a worker busy validating, never with what.
        assert job.job_id not in msgspec.json.encode(theirs).decode()
        assert any(w.busy_stage == "validate" for w in theirs.workers) and theirs.validate.running >= 1
        assert theirs.restricted and theirs.jobs == []
        assert cluster.client.admin and not other.admin
        assert mine.restricted and mine.jobs == [job.job_id]
        assert wanted in [w.busy_candidate for w in mine.workers]
        assert not full.restricted and job.job_id in full.jobs and wanted in [w.busy_candidate for w in full.workers]

        # `specgen status`: the admin's view with the join secret, a plain client's without.
        monkeypatch.delenv(auth.JOIN_SECRET_ENV, raising=False)
        monkeypatch.setattr(auth, "DEFAULT_STATE_DIR", tmp_path / "no-scheduler-here")
        secret = tmp_path / "join_secret"
        secret.write_text(cluster.join_secret.hex() + "\n")
        secret.chmod(0o600)
        capsys.readouterr()
        assert cli_main(["status", "--scheduler", cluster.address, "--json", "--join-secret", str(secret)]) == 0
        assert job.job_id in capsys.readouterr().out
        assert cli_main(["status", "--scheduler", cluster.address]) == 0
        out = capsys.readouterr()
        assert job.job_id not in out.out and "--join-secret FILE" in out.err
        # A default state directory of another scheduler: its secret is not this one's, so status
        # asks as a plain client; the same file named on purpose is an error that says why.
        (tmp_path / "other").mkdir()
        auth.load_join_secret(tmp_path / "other" / auth.JOIN_SECRET_FILE, create=True)
        monkeypatch.setattr(auth, "DEFAULT_STATE_DIR", tmp_path / "other")
        assert cli_main(["status", "--scheduler", cluster.address, "--json"]) == 0
        assert job.job_id not in capsys.readouterr().out
        with pytest.raises(AuthenticationFailed, match="admin credential"):
            Client(cluster.address, join_secret=auth.load_join_secret(tmp_path / "other" / "join_secret"))

        assert victim.cancel_job(job.job_id) == 1          # its owner may
        assert job.result(timeout=30).status == "cancelled"


def test_client_made_ids_are_unguessable(cluster: LocalCluster) -> None:
    with Client(cluster.address) as client:
        jobs = [client.submit(PROBLEM, entry=ENTRY, options={"candidates": {"a": replayed(1.5)}}) for _ in range(2)]
        for job in jobs:
            assert job.result(timeout=60).status == "succeeded"
        assert len(client.client_token) == 32 and int(client.client_token, 16) >= 0
    first, second = (j.job_id for j in jobs)
    assert re.fullmatch(r"job-[0-9a-f]{16}", first) and re.fullmatch(r"job-[0-9a-f]{16}", second)
    assert first[4:12] != second[4:12] and first[12:] != second[12:]   # no part to count on


# -- across a scheduler restart ------------------------------------------------------------------

def start_scheduler(tmp_path: Path, keys: Path | None = None) -> tuple[str, ChildProcess]:
    state = tmp_path / "state"
    (state / "address").unlink(missing_ok=True)
    args = ["--bind", f"ipc://{tmp_path}/s.sock", "--state-dir", str(state)]
    if keys is not None:
        args += ["--keys", str(keys)]
    settings = RuntimeSettings(heartbeat_interval_s=0.25, peer_timeout_s=3.0)
    child = ChildProcess("scheduler", "specgen.runtime.scheduler", args,
                         env={SETTINGS_ENV: settings.to_env()}, log_path=tmp_path / "scheduler.log").start()
    address = wait_for(lambda: (state / "address").exists() and (state / "address").read_text().strip(),
                       30, "the scheduler to listen")
    return str(address), child


def test_with_curve_a_job_stays_its_keys_across_a_restart(tmp_path: Path) -> None:
    """No workers: the job's candidate stays queued, and the journal holds the job and its owner.
    After the restart, a new connection with the owner's key acts for the job; another key, no."""
    keys = tmp_path / "keys"
    generate(keys, clients=2)
    owner_keys, other_keys = load_client_keys(keys, "client"), load_client_keys(keys, "client1")
    address, child = start_scheduler(tmp_path, keys)
    try:
        with Client(address, keys=owner_keys) as owner, Client(address, keys=other_keys) as other:
            ack = owner.conn.request(SubmitCandidate(call_id=0, submission=submission("J1", "c1", replayed(2.0))))
            assert isinstance(ack, SubmitAck) and ack.accepted
            assert refused(lambda: other.job_spec("J1")).code == "not_owner"
            child.stop(5)
            address, child = start_scheduler(tmp_path, keys)
            # The same connection, back after the restart (same key), and a new one with the key.
            assert owner.job_spec("J1").job_id == "J1"
            with Client(address, keys=owner_keys) as again:
                assert again.conn.request(GetJob(call_id=0, job_id="J1")).status.candidates == 1
                again.job("J1")                                      # follows it
            assert refused(lambda: other.job_spec("J1")).code == "not_owner"
            err = refused(lambda: other.conn.request(SubmitCandidate(
                call_id=0, submission=submission("J1", "c2", replayed(9.0)))))
            assert err.code == "not_owner"
        with Client(address, keys=other_keys) as stranger:          # a new connection, the other key
            assert refused(lambda: stranger.cancel_job("J1")).code == "not_owner"
    finally:
        child.stop(5)


def test_without_curve_a_job_stays_its_client_tokens_across_a_restart(tmp_path: Path) -> None:
    """Without CURVE a new connection cannot prove who it is, except by the token its first
    connection presented: a Client given that token owns the job again, a new token does not."""
    address, child = start_scheduler(tmp_path)
    try:
        with Client(address) as owner:
            ack = owner.conn.request(SubmitCandidate(call_id=0, submission=submission("J2", "c1", replayed(2.0))))
            assert isinstance(ack, SubmitAck) and ack.accepted
            token = owner.client_token
            child.stop(5)
            address, child = start_scheduler(tmp_path)
            assert owner.job_spec("J2").job_id == "J2"             # reconnected with its token
        with Client(address, client_token=token) as again:
            assert again.job_spec("J2").job_id == "J2"
        with Client(address) as stranger:
            assert refused(lambda: stranger.job_spec("J2")).code == "not_owner"
    finally:
        child.stop(5)


def test_identities_are_the_curve_key_else_the_token_else_the_connection() -> None:
    assert identity_of("KEY", "t" * 32, b"peer") == "key:KEY"
    token = identity_of(None, "t" * 32, b"peer")
    assert token.startswith("token:") and "t" * 8 not in token     # only a hash is kept
    assert identity_of(None, "", b"peer") == "conn:" + b"peer".hex()
