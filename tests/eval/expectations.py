"""What a test candidate's `# expect:` header asks of its verdict (the red-team files, the corpus).

* `correct`: accepted, no flag, no error, times measured;
* `reject`: not accepted, for any reason;
* `<flag code>`: not accepted, with that flag;
* `error:<text>`: not accepted, the error saying that;
* `honest-speed X`: either not accepted, or accepted with a speedup of at most X (the trick
  around right work gains nothing: X bounds what the honest work it does achieves).
"""
from __future__ import annotations

import re
from pathlib import Path

from specgen.messages import Verdict


def header(path: Path, key: str) -> str | None:
    """`# key: value` from a candidate file's first lines."""
    match = re.search(rf"^# {key}: (.+)$", path.read_text(), flags=re.MULTILINE)
    return match.group(1).strip() if match else None


def codes(verdict: Verdict) -> list[str]:
    return [flag.split(":", 1)[0] for flag in verdict.flags]


def meets(verdict: Verdict, expect: str) -> tuple[bool, str]:
    """(whether `verdict` is what `expect` asks for, why not)."""
    if expect == "correct":
        ok = verdict.correct and not verdict.flags and verdict.error is None
        return ok, "" if ok else f"rejected: {verdict.error or verdict.flags}"
    if expect.startswith("honest-speed"):
        bound = float(expect.split()[1])
        if not verdict.correct:
            return True, ""
        ok = verdict.speedup is None or verdict.speedup <= bound
        return ok, "" if ok else f"accepted at {verdict.speedup:.2f}x, over its honest {bound}x"
    if verdict.correct:
        return False, f"accepted ({verdict.speedup}x)"
    if expect == "reject":
        return True, ""
    if expect.startswith("error:"):
        text = expect[len("error:"):]
        ok = verdict.error is not None and text in verdict.error
        return ok, "" if ok else f"rejected for another reason: {verdict.error or verdict.flags}"
    ok = expect in codes(verdict)
    return ok, "" if ok else f"rejected for another reason: {verdict.error or verdict.flags}"
