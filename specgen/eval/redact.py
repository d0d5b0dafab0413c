"""Candidate-controlled text, made safe to store and to show an LLM: bounded and secret-free.

A verdict's `error`, `flags` and `notes` carry text the candidate chose (an exception message can
hold anything the candidate read). Before a verdict leaves the worker, every such string is cut to
a bound and every value of the worker's environment that its runners are not given (scheduler
addresses, socket paths, settings, keys), and every secret registered here, is replaced.
"""
from __future__ import annotations

import os
import threading

from specgen.eval.guards import FLAG_CODES
from specgen.messages import Verdict

MAX_ERROR_CHARS = 4000
MAX_FLAG_CHARS = 1000
MAX_NOTE_CHARS = 500
MAX_NOTES = 20
_MIN_SECRET_CHARS = 6           # shorter values ("1", "cpu") are words, not secrets
REPLACEMENT = "<redacted>"
# Variables every shell has, whose values (the current folder, the user's name) are no secret and
# would otherwise blank out every path in a traceback.
_PLAIN = {"PWD", "OLDPWD", "HOME", "SHELL", "USER", "LOGNAME", "HOSTNAME", "TERM", "SHLVL", "_",
          "PYTHONPATH", "COLUMNS", "LINES"}

_lock = threading.Lock()
_registered: set[str] = set()


def register_secret(value: str | bytes) -> None:
    """Never let `value` (a key, a token) appear in a verdict from this process."""
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    if len(text) >= _MIN_SECRET_CHARS:
        with _lock:
            _registered.add(text)


def _secrets() -> list[str]:
    from specgen.eval.sandbox import minimal_env

    given = minimal_env()
    values = {v for k, v in os.environ.items()
              if k not in given and k not in _PLAIN and len(v) >= _MIN_SECRET_CHARS}
    with _lock:
        values |= _registered
    return sorted(values, key=len, reverse=True)   # longest first: no partial leftovers


def redact(text: str, limit: int = MAX_ERROR_CHARS, secrets: list[str] | None = None) -> str:
    """`text` with every secret replaced, cut to `limit` characters (cut marked)."""
    for secret in _secrets() if secrets is None else secrets:
        if secret in text:
            text = text.replace(secret, REPLACEMENT)
    if len(text) > limit:
        text = text[:limit - 20] + " ...[cut]"
    return text


def redact_verdict(verdict: Verdict) -> Verdict:
    """Bound and scrub the candidate-controlled strings of `verdict` in place; returns it."""
    secrets = _secrets()
    if verdict.error is not None:
        verdict.error = redact(verdict.error, MAX_ERROR_CHARS, secrets)
    verdict.flags = [redact(f, MAX_FLAG_CHARS, secrets) for f in verdict.flags[:len(FLAG_CODES)]]
    notes = verdict.notes[:MAX_NOTES]
    verdict.notes = [redact(n, MAX_NOTE_CHARS, secrets) for n in notes]
    return verdict
