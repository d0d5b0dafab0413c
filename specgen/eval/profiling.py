"""The judge's timing (eval/judge.py; docs/evaluation.md, "Timing"): the reference's timings, the
candidate's timed calls, the speedup, and the physical floor no honest time goes below.

The reference is timed twice before any candidate code runs anywhere: in the reference runner
(its own timing, cached per problem) and in the candidate's runner before the candidate's module
is loaded there (the timing the candidate is measured against: the same process). A timed call's
windows (making the inputs, the call, the digest) run from the judge sending the request to the
kernel's stamps on the runner's two stage messages and its reply (eval/exchange.py). Each call's
own time is taken from them under the allowance of the reference's windows in that same process
(eval/timing.py), for the reference and the candidate alike.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specgen.eval.exchange import Exchange
from specgen.eval.findings import Findings, Stop
from specgen.eval.floor import floor_ms
from specgen.eval.inputs import Inputs
from specgen.eval.output_checks import OutputChecks, Shipment
from specgen.eval.timing import MIN_MS, Allowance, TimingStats, Windows, net
from specgen.eval.runner_process import Runner
from specgen.messages import (EvalOptions, LoadProblem, ProblemLoaded, RefTiming, RunnerReady, Trial,
                              TrialDone)


FLOOR_MARGIN = 0.5          # beyond-floor: under this share of the physical floor


class _ReferenceFailed(Exception):
    pass


def _ref_timing(stats: TimingStats, allowance: Allowance, resolution: float,
                compiled_ms: float | None) -> RefTiming:
    return RefTiming(ref_ms=stats.median_ms, ref_spread=stats.spread, ref_compiled_ms=compiled_ms,
                     samples=stats.samples, overhead_ms=allowance.overhead_ms,
                     resolution_ms=resolution, made_ms=allowance.made_ms,
                     digest_ms=allowance.digest_ms)


@dataclass
class _Pooled:
    trial: Trial
    digests: list[float]
    tol_norms: list[float]
    input_digests: list[float]


class Profiler:
    """The timing of one evaluation. `ref_timing` is the reference's (cached, or measured here:
    then also `new_ref_timing`, for the cache)."""

    def __init__(self, findings: Findings, inputs: Inputs, exchange: Exchange, checks: OutputChecks,
                 options: EvalOptions, loaded: ProblemLoaded, ready: RunnerReady,
                 ref_timing: RefTiming | None) -> None:
        self.findings = findings
        self.inputs = inputs
        self.exchange = exchange
        self.checks = checks
        self.options = options
        self.loaded = loaded
        self.ready = ready
        self.ref_timing = ref_timing
        self.new_ref_timing: RefTiming | None = None
        self.local: RefTiming | None = None     # the reference in the candidate's runner
        self.resolution_ms = MIN_MS

    # ------------------------------------------------------------------ the reference
    def _trial(self, runner: Runner, **fields: Any) -> Trial:
        """A fresh trial of the reference in `runner` (in a candidate's runner: Trial.reference)."""
        return self.inputs.trial(reference=runner is self.exchange.candidate, **fields)

    def _prime_nothing(self, runner: Runner) -> None:
        """One real call of the reference in `runner`: its calls of nothing digest tensors shaped
        like its last outputs."""
        done: TrialDone = self.exchange.ask(runner, self._trial(runner), TrialDone).message
        if done.error:
            self.findings.fail(f"{done.error} (the reference, not the candidate)")
            raise Stop

    def nothing(self, runner: Runner) -> Windows:
        """One timed call of nothing in `runner`: the same path (inputs made, outputs and inputs
        digested, the reply) with no call."""
        done, windows = self.exchange.timed(runner, self._trial(runner, null=True))
        if done.error or windows is None:
            self.findings.fail(f"the overhead could not be measured: {done.error}")
            raise Stop
        return windows

    def time_reference(self, runner: Runner, trials: int, compiled: bool = False
                       ) -> tuple[TimingStats, Allowance, float]:
        """The reference's timed calls in `runner` (fresh inputs each), each followed by a call of
        nothing, the calls of nothing topped up to EvalOptions.overhead_trials (at most `trials`):
        (its times, the allowance its windows give, the resolution)."""
        options = self.options
        self._prime_nothing(runner)
        calls: list[Windows] = []
        nothing: list[Windows] = []
        for index in range(options.warmup + trials):
            done, windows = self.exchange.timed(runner, self._trial(runner, compiled=compiled))
            if done.error or windows is None:
                what = "torch.compile(Model)" if compiled else "the reference"
                raise _ReferenceFailed(f"timing {what} failed: {done.error}")
            idle = self.nothing(runner)
            if index >= options.warmup:
                calls.append(windows)
                nothing.append(idle)
        while len(nothing) < max(min(options.overhead_trials, trials), 3):
            nothing.append(self.nothing(runner))
        allowance = Allowance.of(calls, nothing)
        resolution = Allowance.resolution(calls, nothing)
        return net(calls, allowance, resolution), allowance, resolution

    def measure_reference(self) -> None:
        """The reference's own timing (unless cached), in the reference runner."""
        options, reference = self.options, self.exchange.reference
        if self.ref_timing is None:
            with self.exchange.turn(exclusive=True, candidate=False), self.findings.timed("ref_timing"):
                try:
                    timing = self.time_reference(reference, options.timing_trials)
                    compiled = None
                    if options.compile_baseline:
                        try:
                            compiled = self.time_reference(reference, options.timing_trials,
                                                           compiled=True)[0].median_ms
                        except _ReferenceFailed as exc:
                            self.findings.notes.append(f"torch.compile baseline failed: {exc}")
                except _ReferenceFailed as exc:
                    self.findings.fail(f"reference {exc}")
                    raise Stop from None
            self.ref_timing = self.new_ref_timing = _ref_timing(*timing, compiled)
        else:
            self.findings.verdict.ref_cached = True

    def measure_local(self, load: LoadProblem) -> None:
        """The reference timed in the candidate's runner before the candidate's code is loaded
        there (EvalOptions.ref_beside_trials calls): what the candidate is measured against.

        The same process the candidate's calls will run in, seconds before them, so whatever makes
        one process slower than another touches both sides alike (on a 2-core host the same
        inputs took 0.30 ms in one runner and 0.48 ms in the next); and no candidate code in it
        yet, so the windows it gives are trusted: the allowance the candidate's windows are
        measured under comes from here."""
        trials = self.options.ref_beside_trials
        if trials <= 0:
            return
        runner = self.exchange.candidate
        loaded: ProblemLoaded = self.exchange.ask(runner, load, ProblemLoaded).message
        if loaded.error:
            self.findings.fail(f"{loaded.error} (the problem, not the candidate)")
            raise Stop
        with self.exchange.turn(exclusive=True), self.findings.timed("local_timing"):
            try:
                self.local = _ref_timing(*self.time_reference(runner, trials), None)
            except _ReferenceFailed as exc:
                self.findings.fail(f"reference {exc} in the candidate's runner, before the "
                                   "candidate's code was loaded (the reference, not the candidate)")
                raise Stop from None

    def _pool(self, count: int) -> list[_Pooled]:
        """The reference's digests of `count` fresh calls, for the candidate's timed calls."""
        pooled = []
        for _ in range(count):
            trial = self.inputs.trial()
            done: TrialDone = self.exchange.ask(self.exchange.reference, Trial(
                index=trial.index, seed=trial.seed, digest_seed=trial.digest_seed, bounds=True),
                TrialDone).message
            if done.error:
                self.findings.fail(f"{done.error} (the reference, not the candidate)")
                raise Stop
            pooled.append(_Pooled(trial, done.digests, done.tol_norms, done.input_digests))
        return pooled

    def _reference_call(self) -> Windows | None:
        """One timed call of the problem's Model on fresh inputs in the candidate's runner,
        between the candidate's calls: the same process, under the same load. None if it failed
        there (a note says why): the candidate's process may have broken it."""
        candidate = self.exchange.candidate
        done, windows = self.exchange.timed(candidate, self._trial(candidate))
        if done.error or windows is None:
            self.findings.notes.append(f"the reference could not be timed in the candidate's "
                                       f"runner: {done.error}")
            return None
        return windows

    # ------------------------------------------------------------------ the candidate
    def profile(self, cuda: bool, ref_error_norms: list[float]) -> None:
        """Time the candidate (its reference timing measured or cached already) and write the
        times and the speedup into the verdict. `ref_error_norms`: the reference's own error.

        Only the timed calls and what is timed beside them hold the GPU's exclusive turn
        (eval/device_turns.py): the reference's digests of those calls are made before it and
        the full comparisons of the calls picked for one after it, so that other workers sharing
        the GPU wait for the timing alone."""
        findings, checks = self.findings, self.checks
        # The reference's digests of the candidate's timed calls, made now (untimed): the
        # reference answers these without waiting for another request, so that it sleeps, not
        # spins, while the candidate is timed.
        with findings.timed("pool"):
            pool = self._pool(self.options.warmup + self.options.timing_trials)
        shipments: list[Shipment] = []
        try:
            with self.exchange.turn(exclusive=True), findings.timed("timing"):
                samples, beside = self._timed_calls(pool, ref_error_norms, shipments)
            with findings.timed("timed_checks"):
                for shipment in shipments:
                    checks.compare_shipped(shipment)
        finally:
            for shipment in shipments:
                shipment.close()
        self._write_times(cuda, samples, beside)

    def _timed_calls(self, pool: list[_Pooled], ref_error_norms: list[float],
                     shipments: list[Shipment]) -> tuple[list[Windows], list[Windows]]:
        """The candidate's timed calls on the pooled trials, and the reference's calls between
        them in the candidate's runner: (the candidate's windows, the reference's). The outputs
        of the calls picked for a full comparison are shipped into `shipments`."""
        options, findings = self.options, self.findings
        exchange, checks = self.exchange, self.checks
        count = len(pool)
        checked = self.inputs.pick(range(options.warmup, count),
                                   min(options.checked_timed_trials, options.timing_trials))
        samples: list[Windows] = []
        beside: list[Windows] = []
        after_warmup = range(options.warmup, count)
        step = max(1, -(-len(after_warmup) // max(options.ref_beside_trials, 1)))
        ref_indices = set(after_warmup[::step]) if options.ref_beside_trials > 0 else set()
        for index, pooled in enumerate(pool):
            done, windows = exchange.timed(exchange.candidate, pooled.trial)
            what = f"timed call {index}"
            if done.error or windows is None:
                findings.fail(f"{done.error} ({what})")
                raise Stop
            checks.launches += done.launches
            reason = checks.digests_differ(done.digests, pooled.digests, pooled.tol_norms,
                                           [2 * e for e in ref_error_norms], what)
            if reason is not None:
                findings.fail(f"{reason} ({what}: its digest, read as the call returned, is not "
                              "the reference's)")
                raise Stop
            if not checks.reference_mutates:
                checks.inputs_unchanged(done.input_digests, pooled.input_digests, what)
            if index in checked:
                shipments.append(checks.ship_timed(pooled.trial, done, what))
            if index >= options.warmup:
                samples.append(windows)
            if index in ref_indices:
                windows = self._reference_call()
                if windows is None:
                    ref_indices = set()
                else:
                    beside.append(windows)
        return samples, beside

    def _write_times(self, cuda: bool, samples: list[Windows], beside: list[Windows]) -> None:
        """The verdict's times and speedup from the timed calls (see "Timing" in the docs)."""
        options, findings, verdict = self.options, self.findings, self.findings.verdict
        # Measured the same way as the reference: under the allowance its windows gave before
        # any candidate code was loaded in this process (Profiler.measure_local; without it, in
        # the reference runner), which the candidate cannot change. One resolution for both
        # times, the reference's: a time below it is counted as it, so no speedup is claimed
        # that the noise could have made.
        ref = self.local or self.ref_timing
        allowance = Allowance(made_ms=ref.made_ms, digest_ms=ref.digest_ms,
                              overhead_ms=ref.overhead_ms)
        resolution = self.resolution_ms = max(ref.resolution_ms, MIN_MS)
        stats = net(samples, allowance, resolution)
        charged = allowance.excess(Windows.medians(samples))
        if charged > resolution:
            # Said in the verdict: time its process spent around the call (making the inputs, the
            # digest) beyond what the reference's took counts as the call's.
            findings.notes.append(f"making the inputs and the digest took {charged:.4f} ms (medians) "
                                  "longer than in the reference's timing: counted in the "
                                  "candidate's time")
        # The reference as timed between the candidate's calls, where that is less: the same
        # process, now under the load of the candidate's calls (a host busier then than now
        # would otherwise make a candidate look faster than it is). Never more: the candidate's
        # code could slow these calls, and then gains nothing.
        ref_ms = ref.ref_ms
        if beside:
            now_ms = allowance.net(Windows.medians(beside))
            if now_ms < ref_ms:
                findings.notes.append(f"the reference timed between the candidate's calls: "
                                      f"{now_ms:.4f} ms (before them: {ref_ms:.4f} ms)")
                ref_ms = now_ms
        ref_ms = max(ref_ms, resolution)
        verdict.ref_ms = ref_ms
        verdict.ref_compiled_ms = self.ref_timing.ref_compiled_ms if self.ref_timing else None
        verdict.candidate_ms = stats.median_ms
        verdict.spread = stats.spread
        verdict.overhead_ms = round(allowance.taken_off(Windows.medians(samples)), 6)
        verdict.speedup = ref_ms / stats.median_ms
        for what, ms in (("the candidate's", stats.median_ms), ("the reference's", ref_ms)):
            if ms <= resolution:
                findings.notes.append(f"{what} time is at or below what the judge resolves here "
                                      f"({resolution:.4f} ms, the spread of a call of nothing and "
                                      "of the reference's windows): counted as that")
        if cuda and options.floor_check:
            self._floor(stats.median_ms, resolution)

    def _floor(self, candidate_ms: float, resolution_ms: float) -> None:
        loaded, device_name = self.loaded, self.ready.device_name
        floor = floor_ms(loaded.input_bytes + loaded.param_bytes, loaded.flops, device_name,
                         loaded.half, self.options.peak_bandwidth_gbs, self.options.peak_tflops)
        if floor is None:
            self.findings.notes.append(f"floor check skipped: no peak figures for {device_name}")
            return
        self.findings.verdict.floor_ms = floor
        # Below half the floor by more than the judge resolves. Half, because what is taken off
        # comes from the reference's windows, not the candidate's own: with the overhead measured
        # that way an honest Triton sum over 1 GB read 0.169 ms against a floor of 0.306 ms on an
        # H100 shared by four workers. Work skipped is caught by the digests; this flag is for
        # times no device of the kind reaches.
        if candidate_ms + resolution_ms < FLOOR_MARGIN * floor:
            self.findings.flag(f"beyond-floor: {candidate_ms:.4f} ms is below half the physical floor "
                               f"{floor:.4f} ms ({loaded.input_bytes + loaded.param_bytes} bytes"
                               + (f", {loaded.flops} flops" if loaded.flops else "")
                               + f" on {device_name})")
