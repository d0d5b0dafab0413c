"""Whether a candidate was judged on this host, and why not: the rule both of the bench's clocks
count answers by (`not_judged_reason`, from a verdict's fields only), and the counts by reason
that their reports print."""
from __future__ import annotations

from typing import Any

from specgen.messages import CandidateRecord

REASON_CHARS = 100


# Why a verdict with a code did not judge its candidate (`Verdict.code`, messages/evaluation.py),
# in words for the report's counts. `candidate_source` and `candidate` are not here: those are
# verdicts on the candidate itself (see `not_judged_reason`).
_CODE_REASONS = {
    "cancelled": "cancelled before its verdict",
    "timeout": "ran past its time limit",
    "reference": "the problem's reference failed here",
    "problem": "the problem's source was refused",
    "build": "its build did not finish (the build runner died or ran out of time)",
    "refused": "refused: this host cannot sandbox candidates",
    "no_runner": "no runner could be started for it",
}


def on_accelerator(device: str) -> bool:
    """Whether a verdict ran on a GPU: a host that has the device a kernel is written for."""
    return device.startswith("cuda")


def not_judged_reason(compiled: bool, code: str, device: str) -> str:
    """"" when a verdict judged its candidate (right or wrong), else why it did not, in words.

    Decided from the verdict's fields, never from its error text:
    - `code` "" and `compiled`: it built, loaded and ran; right, wrong or flagged, it is judged.
    - `code` "" and not `compiled`: it failed to build or load. On a GPU (`device` cuda:N) that is a
      compile or load error on the host the kernel is written for: the answer is wrong, judged.
      On a CPU device it may be CUDA code this host cannot run at all, and no field of the
      verdict tells that apart from a C++ compile error; so it counts as not judged, by that
      reason. (A `code` for "needs a device this worker lacks", set by the evaluator, would let a
      CPU host judge its own compile errors too.)
    - `code` "candidate_source" (the text is no program of the problem: no ModelNew, a syntax
      error, the wrong signature; a static check that runs nothing) and "candidate" (its run sent
      what the judge could not handle): verdicts on the candidate, wrong on any host.
    - any other `code`: the run was cancelled, timed out, or never started for the host's or the
      problem's reason; not judged.
    """
    if code in ("candidate_source", "candidate"):
        return ""
    if code:
        return _CODE_REASONS.get(code, code)
    if compiled or on_accelerator(device):
        return ""
    return f"did not build or load on {device} (no GPU here: CUDA code cannot be judged on it)"


def first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0][:REASON_CHARS] if lines else ""


def outcome(record: CandidateRecord) -> tuple[bool, str, str]:
    """(whether the candidate was judged here, why not, the first line of its error): a correct
    one was; one cancelled or lost before its verdict was not; else its verdict's fields decide
    (`not_judged_reason`)."""
    final = record.profile or record.validation
    if record.status == "correct":
        return True, "", ""
    if final is None or final.cancelled or record.status in ("cancelled", "lost", "pending"):
        return False, record.status if record.status != "failed" else "no verdict", ""
    verdict = final.verdict
    why = not_judged_reason(verdict.compiled, verdict.code, verdict.device)
    return not why, why, first_line(verdict.error or "; ".join(verdict.flags))


def no_evidence() -> dict[str, Any]:
    # not_judged: count per "answer: reason" / "speculative: reason"; not_judged_examples: the
    # first error line seen for each of those keys, so a count can be traced to a message.
    return {"answers": 0, "answers_judged": 0, "speculative": 0, "speculative_judged": 0,
            "not_judged": {}, "not_judged_examples": {}}


def count_not_judged(out: dict[str, Any], key: str, example: str) -> None:
    """One more candidate not judged for `key`; its error line kept if it is the first."""
    out["not_judged"][key] = out["not_judged"].get(key, 0) + 1
    if example and key not in out["not_judged_examples"]:
        out["not_judged_examples"][key] = example


def evidence(candidates: list[CandidateRecord]) -> dict[str, Any]:
    """Answers and speculative candidates (forks, inline drafts) judged here, and why the others
    were not."""
    out = no_evidence()
    for c in candidates:
        if c.duplicate_of is not None:
            continue
        kind = "answers" if c.origin == "final" else "speculative"
        judged, why, example = outcome(c)
        out[kind] += 1
        out[f"{kind}_judged"] += judged
        if not judged:
            count_not_judged(out, f"{'answer' if kind == 'answers' else 'speculative'}: {why}", example)
    return out


def pooled_evidence(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = no_evidence()
    for row in rows:
        for key in ("answers", "answers_judged", "speculative", "speculative_judged"):
            out[key] += row.get(key, 0)
        for why, count in row.get("not_judged", {}).items():
            out["not_judged"][why] = out["not_judged"].get(why, 0) + count
        for why, example in row.get("not_judged_examples", {}).items():
            out["not_judged_examples"].setdefault(why, example)
    return out


def not_judged_lines(evidence: dict[str, Any], over: str) -> list[str]:
    """The candidates not judged here, counted by reason, most first, each with an example error."""
    reasons = sorted(evidence.get("not_judged", {}).items(), key=lambda kv: (-kv[1], kv[0]))
    if not reasons:
        return []
    examples = evidence.get("not_judged_examples", {})
    lines = ["", f"not judged ({over}), by reason:"]
    for why, count in reasons[:10]:
        example = examples.get(why)
        lines.append(f"- {count} x {why}" + (f" (e.g. {example})" if example else ""))
    if len(reasons) > 10:
        lines.append(f"- {sum(c for _, c in reasons[10:])} more, for {len(reasons) - 10} other reason(s)")
    return lines
