"""The candidate's calls checked against the reference (eval/judge.py). Every call goes through the
reference runner's arena (eval/arena.py): the reference runner hands the inputs over, the
candidate's runner calls and leaves its outputs there, and the reference runner reads them itself
and judges them against its own call on the inputs it kept: in full against the accurate value for
a checked call, by a digest whose signs are drawn after the call for a timed one (bounded in
relative error too), with the inputs re-read and the outputs read again last. What the
candidate's runner reports (where its outputs lie, launches, kernel errors, tensor subclasses) can
only reject it: outputs that are not where it says fail their reading.
"""
from __future__ import annotations

import math
import time

from specgen.eval.arena import claimed
from specgen.eval.exchange import Exchange
from specgen.eval.findings import Findings, Stop
from specgen.eval.inputs import Inputs
from specgen.messages import Called, EvalOptions, Handed, OutputMeta, ReadDone, Slot


class OutputChecks:
    """The checks of one evaluation's candidate calls, and what they learnt of the problem on the
    way: whether the problem's Model changes its inputs."""

    def __init__(self, findings: Findings, exchange: Exchange, inputs: Inputs,
                 options: EvalOptions) -> None:
        self.findings = findings
        self.exchange = exchange
        self.inputs = inputs
        self.options = options
        self.launches = 0               # the candidate's custom-kernel launches, as its runner counts

    # ------------------------------------------------------------------ one call
    def called(self, done: Called, what: str, error_flag: str | None = None) -> list[Slot] | None:
        """What the candidate's reply to a call says, checked: where its output tensors lie in
        the arena (within it), or None when the call raised and `error_flag` makes that a flag;
        any other failure stops the evaluation."""
        findings = self.findings
        self.launches += done.launches
        if done.error:
            if error_flag is not None:
                findings.flag(f"{error_flag}: ModelNew raised on {what}: {done.error[:300]}")
                return None
            findings.fail(f"{done.error} ({what})")
            raise Stop
        if done.kernel_errors:
            findings.flag(f"kernel-error-fallback: its kernel raised on {what} and the call still "
                          f"returned: {done.kernel_errors[0]}")
        for meta in done.outputs:
            if meta.kind == "tensor" and not meta.plain:
                findings.flag(f"tensor-subclass: returned a tensor subclass on {what}")
        slots = claimed(done.outputs, self.exchange.arena[1])
        if isinstance(slots, str):
            findings.fail(f"its outputs cannot be read ({what}): {slots}")
            raise Stop
        return slots

    def judged(self, done: Called, read: ReadDone, what: str,
               mismatch_flag: str | None = None) -> bool:
        """The reference runner's reading of the call's outputs: True when right; else the
        verdict says why (or `mismatch_flag`), and False."""
        findings = self.findings
        if read.problem_error:
            findings.fail(f"{read.problem_error} ({what}; the reference, not the candidate)")
            findings.verdict.code = findings.verdict.code or "reference"
            raise Stop
        if read.accurate and not any(n.startswith("accurate reference") for n in findings.notes):
            findings.notes.append(f"accurate reference: {read.accurate}")
        if read.accurate:                           # compared in full
            findings.comparison(read.max_abs, read.max_rel)
        if read.changed:
            findings.fail(f"its outputs changed while the judge read them after the call returned "
                          f"({what}): work still writing them after the call")
            raise Stop
        reason = read.reason or _numbers_differ(done.outputs, read.outputs)
        if read.inputs_changed and not read.reference_mutates:
            findings.flag(f"mutated-inputs: the call changed its input tensors on {what}, which the "
                          "problem's Model does not do")
        if reason is None:
            return True
        if mismatch_flag is None:
            findings.fail(f"{reason} ({what})")
            raise Stop
        findings.flag(f"{mismatch_flag} ({reason})")
        return False

    def checked(self, what: str, mismatch_flag: str | None = None,
                shape: dict[str, int] | None = None, refill: bool = False) -> bool:
        """A call on fresh inputs (of module constants `shape`), its whole output compared with
        the accurate value. `refill`: called first on other inputs in the same memory (a result
        cached by pointer comes back stale). False (the verdict says why, or the flag
        `mismatch_flag`, also for a call that raised) when the outputs are wrong."""
        exchange, findings = self.exchange, self.findings
        code = mismatch_flag.split(":", 1)[0] if mismatch_flag else None
        first = "first_call" not in findings.seconds
        began = time.monotonic()
        if refill:
            slots = self.called(exchange.call(exchange.candidate, self.hand(shape)), what, code)
            if slots is None:
                return False
        handed = self.hand(shape)
        if handed.error:
            findings.notes.append(f"{what} skipped: the reference rejects it ({handed.error[:200]})")
            return True
        done = exchange.call(exchange.candidate, handed)
        if first:
            # The first call compiles Triton kernels (JIT): reported apart as compile time.
            findings.seconds["first_call"] = time.monotonic() - began
        slots = self.called(done, what, code)
        if slots is None:
            return False
        exchange.look(done, slots, self.inputs.seed())
        read = exchange.read(done, True, self.options.atol, self.options.rtol)
        return self.judged(done, read, what, mismatch_flag)

    def hand(self, shape: dict[str, int] | None) -> Handed:
        # Inputs of another shape: the reference's outputs first, so that the arena holds them
        # (and a shape the reference itself rejects is skipped, not held against the candidate).
        return self.exchange.hand(self.inputs.seed(), shape, early=bool(shape),
                                  rejected_ok=bool(shape))


def _numbers_differ(cand: list[OutputMeta], ref: list[OutputMeta]) -> str | None:
    """The outputs that are not tensors (numbers, other objects), as the candidate's reply says."""
    if len(cand) != len(ref):
        return f"returned {len(cand)} outputs, the reference returns {len(ref)}"
    for index, (c, r) in enumerate(zip(cand, ref)):
        if c.kind != r.kind:
            return f"output {index} is a {c.kind}, the reference's a {r.kind}"
        if r.kind == "number":
            c_value, r_value = c.value or 0.0, r.value or 0.0
            if not math.isfinite(c_value) or abs(c_value - r_value) > 1e-4 + 1e-4 * abs(r_value):
                return f"output {index} is {c.value}, expected {r.value}"
        elif r.kind == "other" and c.text != r.text:
            return f"output {index} is a {c.text}, the reference's a {r.text}"
    return None

