"""The prompts of the optimize loop: the task, and the feedback each iteration carries forward.

Every iteration is one fresh chat: a system message and a user message holding the reference
program, the task, and what evaluation said about earlier candidates (compile errors, mismatches,
rejections, speedups and timings), with the best kernel so far in full. Feedback is bounded so the
prompt does not grow without end: the newest entries and the best one are kept, long errors are cut.
"""
from __future__ import annotations

from collections.abc import Sequence

from specgen.messages import CandidateRecord, Verdict

SYSTEM_PROMPT = (
    "You are an expert GPU performance engineer. You write fast, correct kernels in Triton or in "
    "CUDA (through torch.utils.cpp_extension.load_inline) and you think carefully before answering."
)

TASK = """\
Here is a PyTorch program. Write a faster drop-in replacement.

```python
{problem}
```

Write a new program that defines `class ModelNew(nn.Module)` with the same constructor arguments and
`forward` signature as `Model`, computing the same outputs (fp32 tolerance 1e-4) faster, using
custom Triton or CUDA kernels where they help. Keep `get_inputs()` and `get_init_inputs()` as they
are. Answer with one complete ```python block: imports, kernels, and `ModelNew`.
"""

FEEDBACK_HEADER = "\nYour earlier candidates were evaluated (newest last):\n"
BEST_HEADER = "\nThe best correct kernel so far ({speedup:.2f}x the reference):\n\n```python\n{source}```\n"
CLOSING = "\nImprove on the best kernel so far: fix what failed, make the fast path faster.\n"

MAX_FEEDBACK_ENTRIES = 8
MAX_ERROR_CHARS = 600


def _cut(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    # The end of a compiler error or traceback says most; keep the head for context.
    head = limit // 3
    return text[:head] + "\n[...]\n" + text[-(limit - head):]


def describe_verdict(verdict: Verdict) -> str:
    """One candidate's evaluation in words a model can act on."""
    if verdict.flags:
        # Flags quote the candidate's own source: bounded like errors.
        return "rejected by the evaluation's checks: " + _cut("; ".join(verdict.flags))
    if not verdict.compiled:
        return "failed to load or compile:\n" + _cut(verdict.error or "no error message")
    if not verdict.correct:
        if verdict.error:
            return "crashed while running:\n" + _cut(verdict.error)
        parts = ["wrong output"]
        if verdict.max_abs_error is not None:
            parts.append(f"max abs error {verdict.max_abs_error:.3g}")
        if verdict.max_rel_error is not None:
            parts.append(f"max relative error {verdict.max_rel_error:.3g}")
        return ", ".join(parts)
    if verdict.speedup is None:
        return "correct (not profiled yet)"
    timing = ""
    if verdict.ref_ms is not None and verdict.candidate_ms is not None:
        timing = f" ({verdict.candidate_ms:.3f} ms vs {verdict.ref_ms:.3f} ms for the reference"
        timing += ", CPU timing)" if verdict.cpu_timing else ")"
    return f"correct, {verdict.speedup:.2f}x the reference{timing}"


def _final_verdict(record: CandidateRecord) -> Verdict | None:
    final = record.profile or record.validation
    return final.verdict if final is not None else None


def feedback_lines(records: Sequence[CandidateRecord]) -> list[str]:
    """A line (or a few) per evaluated candidate, oldest first, bounded in number."""
    done = [r for r in records if r.duplicate_of is None and _final_verdict(r) is not None
            and r.status not in ("cancelled", "pending")]
    done = done[-MAX_FEEDBACK_ENTRIES:]
    lines = []
    for record in done:
        verdict = _final_verdict(record)
        assert verdict is not None
        where = {"fork": "written mid-reasoning", "inline": "from your reasoning",
                 "final": "your final answer"}.get(record.origin, record.origin)
        lines.append(f"- iteration {record.iteration + 1}, {where} ({record.candidate_id}): "
                     f"{describe_verdict(verdict)}")
    return lines


def user_prompt(problem_source: str, records: Sequence[CandidateRecord],
                best: CandidateRecord | None, notes: Sequence[str] = ()) -> str:
    """The user message of the next iteration; `notes` are remarks about earlier iterations
    (e.g. that one produced no program at all), newest last."""
    text = TASK.format(problem=problem_source.strip("\n"))
    lines = feedback_lines(records) + [f"- {note}" for note in list(notes)[-3:]]
    if lines:
        text += FEEDBACK_HEADER + "\n".join(lines) + "\n"
    if best is not None and best.speedup is not None:
        text += BEST_HEADER.format(speedup=best.speedup, source=best.source)
    if lines or best is not None:
        text += CLOSING
    return text


def chat(problem_source: str, records: Sequence[CandidateRecord],
         best: CandidateRecord | None, notes: Sequence[str] = ()) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user_prompt(problem_source, records, best, notes)},
    ]
