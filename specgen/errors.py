"""Error types shared by every part of specgen.

`UsageError` is what bad user input raises (missing file, malformed problem, wrong flag). The CLI
prints its message as one line and exits with code 2; it never shows a traceback for it. Every
other error specgen raises on purpose derives from `SpecgenError` too (beside the built-in type
its callers catch, e.g. `RunnerError(SpecgenError, RuntimeError)`), and the CLI prints it as one
line (exit 1). Left outside on purpose: the judge's internal control-flow signals
(`eval/findings.Stop`) and the importer's `ImportInterrupted`, a `BaseException` so that no
`except Exception` swallows a signal.
"""


class SpecgenError(Exception):
    """Base class for errors specgen raises on purpose."""


class UsageError(SpecgenError):
    """Bad input from the user: the message says what to fix."""
