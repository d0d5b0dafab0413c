"""Error types shared by every part of specgen.

`UsageError` is what bad user input raises (missing file, malformed problem, wrong flag). The CLI
prints its message as one line and exits with code 2; it never shows a traceback for it.
"""


class SpecgenError(Exception):
    """Base class for errors specgen raises on purpose."""


class UsageError(SpecgenError):
    """Bad input from the user: the message says what to fix."""
