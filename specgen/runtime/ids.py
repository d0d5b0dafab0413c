"""Ids nobody can guess: a readable prefix and 16 hex digits (64 random bits).

Job ids and the optimize loop's candidate ids are made here. They need not be secret (they show in
logs, traces and a job's own stats) but must not be predictable: a job's requests are taken from
its owner only (runtime/ownership.py), and an id nobody can guess keeps another client from even
aiming at one it was not shown.
"""
from __future__ import annotations

import secrets

RANDOM_HEX_DIGITS = 16


def new_id(prefix: str) -> str:
    """`prefix`-<16 random hex digits>, e.g. new_id("c003") -> "c003-9f1c2b7a0d4e6f18"."""
    return f"{prefix}-{secrets.token_hex(RANDOM_HEX_DIGITS // 2)}"


def new_job_id() -> str:
    return new_id("job")
