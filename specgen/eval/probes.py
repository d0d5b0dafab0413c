"""The judge's probes (eval/judge.py): trials beyond the plain correctness trials, each made to
catch a candidate that is right only where it is usually checked: inputs refilled in place
(memoization), a second input shape (hard-coded shapes), random parameters (outputs baked in for
the initial weights); and, after them, whether the kernels the candidate defines ran at all.
"""
from __future__ import annotations

from specgen.eval.exchange import Exchange
from specgen.eval.findings import Findings
from specgen.eval.inputs import other_size
from specgen.eval.loader import CandidateSource
from specgen.eval.output_checks import OutputChecks
from specgen.messages import BuildRecord, EvalOptions, ParamsSet, ProblemLoaded, SetParams


class Probes:
    """The probes of one evaluation, over the judge's other parts."""

    def __init__(self, findings: Findings, exchange: Exchange, checks: OutputChecks,
                 options: EvalOptions, loaded: ProblemLoaded) -> None:
        self.findings = findings
        self.exchange = exchange
        self.checks = checks
        self.options = options
        self.loaded = loaded

    def run(self) -> None:
        self._memo_probe()
        # The second shape runs before parameters are randomized, so that a candidate failing
        # both is told about each for its own reason.
        if self.options.second_shape:
            self._second_shape()
        if self.options.randomized_params:
            self._randomized_params()

    def _memo_probe(self) -> None:
        """The same input tensors refilled with new values: a result cached by pointer, shape or
        call comes back stale."""
        if self.loaded.input_bytes == 0:
            self.findings.notes.append("memoization probe skipped: no tensor inputs")
            return
        self.checks.checked("inputs refilled in place", refill=True,
                            mismatch_flag="memoized: the output did not follow its inputs refilled "
                                          "in place (a result cached by data pointer, shape or call)")

    def _second_shape(self) -> None:
        constants = self.loaded.shape_constants
        if not constants:
            self.findings.notes.append("second shape skipped: no module constant is read only by "
                                       "get_inputs()")
            return
        changed = {name: other_size(value) for name, value in constants.items()}
        what = "second shape " + ", ".join(f"{k}={v}" for k, v in changed.items())
        self.checks.checked(what, mismatch_flag=f"hard-coded-shape: wrong on {what}", shape=changed)

    def _randomized_params(self) -> None:
        params = self.loaded.params
        if not params:
            return
        exchange = self.exchange
        seed = self.checks.inputs.seed()
        result: ParamsSet = exchange.ask(exchange.candidate, SetParams(seed=seed, reference=params),
                                         ParamsSet).message
        if result.error:
            # The candidate's runner answers this request, so its error is its word: whatever it
            # says, random parameter values were not shown to reach its outputs, and a skipped
            # trial would let a model right only at its initial values pass.
            self.findings.flag(f"parameter-mismatch: its runner did not load the reference's "
                               f"parameter values ({result.error[:300]})")
            return
        exchange.ask(exchange.reference, SetParams(seed=seed), ParamsSet)
        try:
            self.checks.checked("randomized parameters",
                                mismatch_flag="initial-params-only: with random parameter values "
                                              "loaded into both models the outputs differ")
        finally:
            # The reference runner serves later candidates: its parameters go back, always.
            exchange.ask(exchange.reference, SetParams(seed=None), ParamsSet)
        exchange.ask(exchange.candidate, SetParams(seed=None, reference=params), ParamsSet)

    def kernels_ran(self, candidate: CandidateSource, builds: list[BuildRecord],
                    device: str) -> None:
        """A candidate that defines kernels must have run one (a fallback that ran is flagged; a
        fallback written but never taken is not). `builds`: its load_inline calls."""
        failed = [b for b in builds if not b.ok]
        if failed:
            self.findings.flag(f"custom-kernel-not-run: extension {failed[0].name} failed to build "
                               f"({(failed[0].error or '')[:300]}) and the candidate ran without it")
        elif candidate.claims_custom_kernels and self.checks.launches == 0:
            host_only = [b.name for b in builds if not b.device_code]
            if host_only and device.startswith("cuda"):
                self.findings.flag(f"custom-kernel-not-run: extension {host_only[0]} has no device "
                                   "code (no cuda_sources, no __global__ function): on the GPU it "
                                   "only calls library kernels")
                return
            kinds = " and ".join(candidate.kernel_kinds)
            self.findings.flag(f"custom-kernel-not-run: the candidate defines {kinds} kernels but "
                               "none of them ran")
