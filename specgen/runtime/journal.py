"""Durable job state: jobs, accepted candidates, every stage verdict and every job event.

SQLite in WAL mode with `synchronous=NORMAL`: a commit survives the scheduler process being
killed (the case we design for); only a power loss can lose the last commits. The scheduler
commits once per batch of handled messages and sends the replies and updates of that batch only
after the commit, so nothing a peer was told can be missing after a restart.

A job's row keeps its owner (runtime/ownership.py: a CURVE key, or a hash of a client's token, or
a connection), so that a restarted scheduler still takes the job's requests from its owner only.
A journal written before owners were kept gets the column on opening; its jobs have no owner
("") and only their reasoners and the admin act for them.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from specgen.messages import CandidateSubmission, CandidateUpdate, JobEvent, JobResult, JobSpec
from specgen.runtime.private_files import touch_private

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY, spec BLOB NOT NULL, state TEXT NOT NULL,
    has_reasoner INTEGER NOT NULL, attempts INTEGER NOT NULL, result BLOB, owner TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS candidates (
    job_id TEXT NOT NULL, candidate_id TEXT NOT NULL, submission BLOB NOT NULL,
    PRIMARY KEY (job_id, candidate_id));
CREATE TABLE IF NOT EXISTS updates (
    job_id TEXT NOT NULL, candidate_id TEXT NOT NULL, stage TEXT NOT NULL, update_ BLOB NOT NULL,
    PRIMARY KEY (job_id, candidate_id, stage));
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL, seq INTEGER NOT NULL, event BLOB NOT NULL, PRIMARY KEY (job_id, seq));
"""

_enc = msgspec.msgpack.Encoder()
_dec_spec = msgspec.msgpack.Decoder(JobSpec)
_dec_sub = msgspec.msgpack.Decoder(CandidateSubmission)
_dec_upd = msgspec.msgpack.Decoder(CandidateUpdate)
_dec_event = msgspec.msgpack.Decoder(JobEvent)
_dec_result = msgspec.msgpack.Decoder(JobResult)


@dataclass
class JobRecord:
    spec: JobSpec
    state: str
    has_reasoner: bool
    attempts: int
    result: JobResult | None = None
    owner: str = ""                     # who may act for the job (runtime/ownership.py); "" = nobody but admin
    candidates: list[CandidateSubmission] = field(default_factory=list)
    updates: list[CandidateUpdate] = field(default_factory=list)
    last_seq: int = 0


class Journal:
    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        # Made here, mode 0600, for SQLite to open: it would create it 0644, and its -wal and -shm
        # files take the database file's mode.
        if self.path != ":memory:":
            touch_private(self.path)
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(jobs)")}
        if "owner" not in columns:   # a journal from before owners were kept
            self.db.execute("ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT ''")
        self._in_tx = False
        self.writes = 0

    def _begin(self) -> None:
        if not self._in_tx:
            self.db.execute("BEGIN")
            self._in_tx = True

    def commit(self) -> None:
        if self._in_tx:
            self.db.execute("COMMIT")
            self._in_tx = False

    def close(self) -> None:
        self.commit()
        self.db.close()

    # -- writes (inside the current batch's transaction) ------------------------------------
    def put_job(self, spec: JobSpec, state: str, has_reasoner: bool, attempts: int,
                result: JobResult | None = None, owner: str = "") -> None:
        self._begin()
        self.writes += 1
        self.db.execute(
            "INSERT OR REPLACE INTO jobs (job_id, spec, state, has_reasoner, attempts, result, owner) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (spec.job_id, _enc.encode(spec), state, int(has_reasoner), attempts,
             _enc.encode(result) if result is not None else None, owner),
        )

    def put_candidate(self, sub: CandidateSubmission) -> None:
        self._begin()
        self.writes += 1
        self.db.execute(
            "INSERT OR IGNORE INTO candidates VALUES (?, ?, ?)",
            (sub.job_id, sub.candidate_id, _enc.encode(sub)),
        )

    def put_update(self, upd: CandidateUpdate) -> None:
        self._begin()
        self.writes += 1
        self.db.execute(
            "INSERT OR IGNORE INTO updates VALUES (?, ?, ?, ?)",
            (upd.job_id, upd.candidate_id, upd.stage, _enc.encode(upd)),
        )

    def put_event(self, event: JobEvent) -> None:
        self._begin()
        self.writes += 1
        self.db.execute(
            "INSERT OR IGNORE INTO events VALUES (?, ?, ?)",
            (event.job_id, event.seq, _enc.encode(event)),
        )

    # -- reads ------------------------------------------------------------------------------
    def unfinished_jobs(self) -> list[JobRecord]:
        rows = self.db.execute(
            "SELECT spec, state, has_reasoner, attempts, owner FROM jobs WHERE state != 'finished'"
        ).fetchall()
        records = []
        for spec_b, state, has_reasoner, attempts, owner in rows:
            spec = _dec_spec.decode(spec_b)
            rec = JobRecord(spec=spec, state=state, has_reasoner=bool(has_reasoner), attempts=attempts,
                            owner=owner)
            rec.candidates = [_dec_sub.decode(b) for (b,) in self.db.execute(
                "SELECT submission FROM candidates WHERE job_id = ? ORDER BY rowid", (spec.job_id,))]
            rec.updates = self.updates_of(spec.job_id)
            rec.last_seq = self.last_seq(spec.job_id)
            records.append(rec)
        return records

    def job(self, job_id: str) -> JobRecord | None:
        row = self.db.execute(
            "SELECT spec, state, has_reasoner, attempts, result, owner FROM jobs WHERE job_id = ?", (job_id,)
        ).fetchone()
        if row is None:
            return None
        spec_b, state, has_reasoner, attempts, result_b, owner = row
        rec = JobRecord(
            spec=_dec_spec.decode(spec_b), state=state, has_reasoner=bool(has_reasoner),
            attempts=attempts, result=_dec_result.decode(result_b) if result_b else None, owner=owner,
        )
        rec.last_seq = self.last_seq(job_id)
        return rec

    def counts(self, job_id: str) -> tuple[int, int]:
        (cands,) = self.db.execute("SELECT COUNT(*) FROM candidates WHERE job_id = ?", (job_id,)).fetchone()
        (upds,) = self.db.execute("SELECT COUNT(*) FROM updates WHERE job_id = ?", (job_id,)).fetchone()
        return cands, upds

    def updates_of(self, job_id: str) -> list[CandidateUpdate]:
        return [_dec_upd.decode(b) for (b,) in self.db.execute(
            "SELECT update_ FROM updates WHERE job_id = ? ORDER BY rowid", (job_id,))]

    def last_seq(self, job_id: str) -> int:
        (seq,) = self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM events WHERE job_id = ?", (job_id,)).fetchone()
        return int(seq)

    def events_after(self, job_id: str, seq: int, limit: int = 100_000) -> list[JobEvent]:
        return [_dec_event.decode(b) for (b,) in self.db.execute(
            "SELECT event FROM events WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (job_id, seq, limit))]
