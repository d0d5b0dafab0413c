from __future__ import annotations

from specgen.messages import CandidateRecord, CandidateUpdate, Verdict
from specgen.optimize import prompts

PROBLEM = "import torch\nclass Model(torch.nn.Module):\n    pass\n"


def record(cid: str, verdict: Verdict, *, stage: str = "validate", origin: str = "fork",
           status: str = "failed", source: str = "class ModelNew: pass\n") -> CandidateRecord:
    update = CandidateUpdate(job_id="j", candidate_id=cid, stage=stage, verdict=verdict)
    r = CandidateRecord(candidate_id=cid, iteration=0, origin=origin, request_id="r", position=10,
                        fingerprint=cid, source=source, extracted_at=0.0, status=status)
    if stage == "validate":
        r.validation = update
    else:
        r.profile = update
    return r


def test_first_prompt_is_the_task_only() -> None:
    text = prompts.user_prompt(PROBLEM, [], None)
    assert PROBLEM.strip() in text and "ModelNew" in text
    assert "evaluated" not in text


def test_feedback_carries_errors_mismatches_rejections_and_timings() -> None:
    compile_error = record("c000", Verdict(compiled=False, error="NameError: name 'tl' is not defined"))
    mismatch = record("c001", Verdict(compiled=True, correct=False, max_abs_error=0.5,
                                      max_rel_error=0.25), status="incorrect")
    cheat = record("c002", Verdict(compiled=True, flags=["output aliases an input"]))
    fast = record("c003", Verdict(compiled=True, correct=True, speedup=1.8, ref_ms=2.0,
                                  candidate_ms=1.111, cpu_timing=True),
                  stage="profile", origin="final", status="correct",
                  source="class ModelNew:\n    fast = True\n")
    pending = record("c004", Verdict(), status="pending")
    text = prompts.user_prompt(PROBLEM, [compile_error, mismatch, cheat, fast, pending], fast,
                               notes=["Iteration 2 produced no program."])
    assert "NameError: name 'tl' is not defined" in text
    assert "wrong output" in text and "0.5" in text and "0.25" in text
    assert "output aliases an input" in text
    assert "1.80x" in text and "1.111 ms" in text and "CPU timing" in text
    assert "c004" not in text
    assert "fast = True" in text                     # the best kernel in full
    assert "Iteration 2 produced no program." in text
    assert text.index("c000") < text.index("c003")


def test_long_errors_are_cut_keeping_head_and_tail() -> None:
    long_error = "HEAD " + "x" * 5000 + " TAIL"
    text = prompts.describe_verdict(Verdict(compiled=False, error=long_error))
    assert "HEAD" in text and "TAIL" in text and len(text) < 800


def test_feedback_is_bounded() -> None:
    many = [record(f"c{i:03d}", Verdict(compiled=False, error=f"err{i}")) for i in range(30)]
    lines = prompts.feedback_lines(many)
    assert len(lines) == prompts.MAX_FEEDBACK_ENTRIES and "c029" in lines[-1]


def test_chat_has_system_and_user_messages() -> None:
    messages = prompts.chat(PROBLEM, [], None)
    assert [m["role"] for m in messages] == ["system", "user"]
