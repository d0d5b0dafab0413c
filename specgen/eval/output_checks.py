"""The candidate's calls checked against the reference (eval/judge.py): its whole output, copied
into a shared buffer, compared by the reference runner with the accurate value; its digest, read
as the call returned, matched with the reference's; its inputs left as the reference's call
leaves them. What its runner reports besides (launches, kernel errors, tensor subclasses) can
only reject it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from specgen.eval.exchange import Exchange
from specgen.eval.findings import Findings, Stop
from specgen.eval.output_buffers import OutputBuffer, OutputBuffers
from specgen.messages import (Compare, Compared, EvalOptions, OutputMeta, OutputSlot, Ship, Shipped,
                              Trial, TrialDone)

DIGEST_SIGMAS = 6.0             # a right output's digest misses by more than this < 3e-8 of the time


@dataclass
class Shipment:
    """A timed call's output in a buffer of the judge's, waiting for its full comparison."""

    trial: Trial
    slots: list[OutputSlot]
    buffer: OutputBuffer | None
    what: str
    checks: "OutputChecks"

    @property
    def fd(self) -> int:
        return self.buffer.fd if self.buffer is not None else -1

    def close(self) -> None:
        """The buffer back to the worker's pool (once)."""
        if self.buffer is not None:
            self.checks.release(self.buffer)
            self.buffer = None


def _slots_size(outputs: list[OutputMeta]) -> int:
    """Bytes of a buffer that holds the tensors of `outputs`, each at a 64-byte boundary."""
    return sum((m.nbytes + 63) // 64 * 64 for m in outputs if m.kind == "tensor")


def same_digests(a: list[float], b: list[float]) -> bool:
    """Digests of the same values: equal but for the order of the float64 sum, which on a GPU
    changes from one digest to the next (blocks add their parts atomically), so never compared
    with `==`."""
    return len(a) == len(b) and all(math.isfinite(x) and abs(x - y) <= 1e-9 * (abs(y) + 1.0)
                                    for x, y in zip(a, b))


def digest_bound(tol_norm: float, ref_error_norm: float, reference: float) -> float:
    """How far a right output's digest may be from the reference's.

    With signs s (eval/digest.py) and e = output - reference independent of them, sum(e x s)
    has mean 0, deviation |e| and sub-Gaussian tails (Hoeffding: P(> k |e|) <= 2 exp(-k^2 / 2));
    a right output has |e| <= |tolerance| + |reference error|. (The runner computes the digest,
    so the candidate's process can know the signs; to match the reference's digest with a wrong
    output it would still need the reference's digest, which only the right output gives it.)"""
    return DIGEST_SIGMAS * (tol_norm + ref_error_norm) + 1e-9 * abs(reference) + 1e-12


class OutputChecks:
    """The checks of one evaluation's candidate calls, and what they learnt of the problem on the
    way: `ref_error_norms` (the reference's own error, largest seen per output, kept with the
    problem) and whether the problem's Model changes its inputs.

    Outputs travel in buffers of the worker's `buffers` (eval/output_buffers.py), taken for the
    job `owner`; without a pool, in buffers of this evaluation's own."""

    def __init__(self, findings: Findings, exchange: Exchange, options: EvalOptions,
                 ref_error_norms: list[float], buffers: OutputBuffers | None = None,
                 owner: str = "") -> None:
        self.findings = findings
        self.exchange = exchange
        self.options = options
        self.ref_error_norms = ref_error_norms
        self.launches = 0               # the candidate's custom-kernel launches, as its runner counts
        self.reference_mutates = False
        self.buffers = buffers if buffers is not None else OutputBuffers(keep_bytes=0)
        self.owner = owner
        self._checked: OutputBuffer | None = None     # the checked calls' buffer, one at a time

    def buffer(self, nbytes: int) -> int:
        if self._checked is None or nbytes > self._checked.size:
            if self._checked is not None:
                self.release(self._checked)
            self._checked = None
            self._checked = self.buffers.take(nbytes, self.owner)
        return self._checked.fd

    def release(self, buffer: OutputBuffer) -> None:
        self.buffers.give(buffer, self.owner)

    def close(self) -> None:
        if self._checked is not None:
            self.release(self._checked)
            self._checked = None

    # ------------------------------------------------------------------ one checked call
    def call(self, trial: Trial, what: str, error_flag: str | None = None) -> TrialDone | None:
        """The candidate's call of `trial`; its error stops the evaluation (or, with
        `error_flag`, becomes that flag and None)."""
        findings = self.findings
        first = "first_call" not in findings.seconds
        began = time.monotonic()
        done: TrialDone = self.exchange.ask(self.exchange.candidate, trial, TrialDone).message
        if first:
            # The first call compiles Triton kernels (JIT): reported apart as compile time.
            findings.seconds["first_call"] = time.monotonic() - began
        self.launches += done.launches
        if done.index != trial.index:
            findings.fail(f"the candidate's runner answered trial {done.index} to trial {trial.index}")
            raise Stop
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
        return done

    def ship(self, trial: Trial, what: str, fd: int) -> list[OutputSlot]:
        """The candidate's output of `trial` (its last call) copied into the buffer `fd`."""
        shipped: Shipped = self.exchange.ask(self.exchange.candidate, Ship(index=trial.index),
                                             Shipped, (fd,)).message
        if shipped.error:
            self.findings.fail(f"the candidate's output could not be read ({what}): {shipped.error}")
            raise Stop
        return shipped.slots

    def compare(self, trial: Trial, slots: list[OutputSlot], fd: int, what: str) -> Compared:
        """The reference's comparison of the output shipped into `fd` with its accurate value."""
        compared: Compared = self.exchange.ask(
            self.exchange.reference, Compare(trial=trial, slots=slots, atol=self.options.atol,
                                             rtol=self.options.rtol), Compared, (fd,)).message
        if compared.problem_error:
            self.findings.fail(f"{compared.problem_error} ({what}; the reference, not the candidate)")
            raise Stop
        return compared

    def checked(self, trial: Trial, what: str, mismatch_flag: str | None = None) -> bool:
        """Run `trial` on the candidate, compare its whole output with the reference's accurate
        value and its digest with the reference's. False (and the verdict says why, or the flag
        `mismatch_flag` when given, also for a call that raised) when they differ."""
        findings = self.findings
        code = mismatch_flag.split(":", 1)[0] if mismatch_flag else None
        done = self.call(trial, what, error_flag=code)
        if done is None:
            return False
        buffer = self.buffer(_slots_size(done.outputs))
        compared = self.compare(trial, self.ship(trial, what, buffer), buffer, what)
        if compared.accurate and not any(n.startswith("accurate reference") for n in findings.notes):
            findings.notes.append(f"accurate reference: {compared.accurate}")
        findings.comparison(compared.max_abs, compared.max_rel)
        reason = compared.reason if not compared.ok else None
        if reason is None:
            reason = self._numbers_differ(done.outputs, compared.outputs)
        if reason is None:
            reason = self.digests_differ(done.digests, compared.digests, compared.tol_norms,
                                         compared.ref_error_norms, what)
        if reason is None:
            if not trial.shape and not trial.refill_seed:
                self._keep_ref_error(compared.ref_error_norms)
            mutates = not same_digests(compared.pristine_digests, compared.input_digests)
            self.reference_mutates = self.reference_mutates or mutates
            if not mutates and trial.refill_seed is None:
                self.inputs_unchanged(done.input_digests, compared.input_digests, what)
            return True
        if mismatch_flag is None:
            findings.fail(f"{reason} ({what})")
            raise Stop
        findings.flag(f"{mismatch_flag} ({reason})")
        return False

    def ship_timed(self, trial: Trial, done: TrialDone, what: str) -> Shipment:
        """The output of the timed call just made (picked unpredictably), copied into a buffer of
        its own: it is compared after the timing (`compare_shipped`), so that the comparison's
        work runs beside other workers' requests, not inside this worker's exclusive turn.

        The comparison proves what a full comparison always proves (docs/evaluation.md): that
        the candidate's process could produce the right output for these inputs; that the
        timed call returned it rests on its digest, checked already."""
        buffer = self.buffers.take(_slots_size(done.outputs), self.owner)
        try:
            return Shipment(trial, self.ship(trial, what, buffer.fd), buffer, what, self)
        except BaseException:
            self.release(buffer)
            raise

    def compare_shipped(self, shipment: Shipment) -> None:
        compared = self.compare(shipment.trial, shipment.slots, shipment.fd, shipment.what)
        shipment.close()
        if not compared.ok:
            self.findings.fail(f"{compared.reason} ({shipment.what})")
            raise Stop

    # ------------------------------------------------------------------ the comparisons
    def _numbers_differ(self, cand: list[OutputMeta], ref: list[OutputMeta]) -> str | None:
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

    def digests_differ(self, cand: list[float], ref: list[float], tol_norms: list[float],
                       ref_errors: list[float], what: str) -> str | None:
        if len(cand) != len(ref):
            return f"returned {len(cand)} output tensors, the reference returns {len(ref)}"
        for index, (c, r) in enumerate(zip(cand, ref)):
            tol = tol_norms[index] if index < len(tol_norms) else 0.0
            err = ref_errors[index] if index < len(ref_errors) else 0.0
            if not math.isfinite(c) or abs(c - r) > digest_bound(tol, err, r):
                return (f"output {index} when the call returned was not the output compared "
                        f"afterwards: its digest {c:.6g} is not the reference's {r:.6g} "
                        f"(work finishing after the call returned, or an output that changes)")
        return None

    def inputs_unchanged(self, cand: list[float], ref: list[float], what: str) -> None:
        """The call left its inputs as the reference's call leaves them."""
        if not same_digests(cand, ref):
            self.findings.flag(f"mutated-inputs: the call changed its input tensors on {what}, which "
                               "the problem's Model does not do")

    def _keep_ref_error(self, norms: list[float]) -> None:
        kept = self.ref_error_norms
        if len(kept) != len(norms):
            kept[:] = list(norms)
        else:
            kept[:] = [max(a, b) for a, b in zip(kept, norms)]
