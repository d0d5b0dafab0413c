"""The judge's timing (eval/judge.py; docs/evaluation.md, "Timing"): the reference's timing, taken
before the candidate's code exists anywhere, the candidate's timed calls with the calls of nothing
beside them, the speedup, and the physical floor no honest time goes below.

A trial's time is from the judge sending the request to the kernel's timestamp on the reply
(eval/exchange.py). The same path timed with no call at all (the overhead) is measured in the
reference runner and subtracted from both sides' medians alike; its spread is the resolution,
below which no time is claimed.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from specgen.eval.exchange import Exchange
from specgen.eval.findings import Findings, Stop
from specgen.eval.floor import floor_ms
from specgen.eval.inputs import Inputs
from specgen.eval.output_checks import OutputChecks, Shipment
from specgen.eval.timing import MIN_MS, TimingStats, net, summarize
from specgen.messages import EvalOptions, ProblemLoaded, RefTiming, RunnerReady, Trial, TrialDone


FLOOR_MARGIN = 0.5          # beyond-floor: under this share of the physical floor


class _ReferenceFailed(Exception):
    pass


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
        self.resolution_ms = MIN_MS

    # ------------------------------------------------------------------ the calls of nothing
    def _prime_nothing(self) -> None:
        """One real call in the reference runner: the calls of nothing digest tensors shaped like
        its last outputs."""
        done: TrialDone = self.exchange.ask(self.exchange.reference, self.inputs.trial(),
                                            TrialDone).message
        if done.error:
            self.findings.fail(f"{done.error} (the reference, not the candidate)")
            raise Stop

    def nothing(self) -> float:
        """One timed call of nothing in the reference runner: the same path (inputs made, outputs
        and inputs digested, the reply) with no call. What every call's time includes besides
        the call."""
        done, ms = self.exchange.timed(self.exchange.reference, self.inputs.trial(null=True))
        if done.error:
            self.findings.fail(f"the overhead could not be measured: {done.error}")
            raise Stop
        return ms

    def overhead_of(self, samples: list[float]) -> tuple[float, float]:
        """(median, p75 - p25) of calls of nothing taken between the timed calls, topped up to
        EvalOptions.overhead_trials: what is subtracted, and how finely the judge resolves."""
        while len(samples) < max(self.options.overhead_trials, 3):
            samples.append(self.nothing())
        stats = summarize(samples)
        return stats.median_ms, max(stats.p75_ms - stats.p25_ms, MIN_MS)

    # ------------------------------------------------------------------ the reference
    def time_reference(self, compiled: bool = False) -> tuple[TimingStats, float, float]:
        """The reference's timed calls (fresh inputs each), each followed by a call of nothing:
        the overhead is measured under the same conditions (clocks, caches) as the calls."""
        count = self.options.warmup + self.options.timing_trials
        self._prime_nothing()
        samples, nothing = [], []
        for index in range(count):
            done, ms = self.exchange.timed(self.exchange.reference, self.inputs.trial(compiled=compiled))
            if done.error:
                what = "torch.compile(Model)" if compiled else "the reference"
                raise _ReferenceFailed(f"timing {what} failed: {done.error}")
            idle = self.nothing()
            if index >= self.options.warmup:
                samples.append(ms)
                nothing.append(idle)
        overhead, resolution = self.overhead_of(nothing)
        return net(samples, overhead, resolution), overhead, resolution

    def measure_reference(self) -> None:
        """The reference's timing (unless cached) and the overhead, in the reference runner."""
        options = self.options
        if self.ref_timing is None:
            with self.exchange.turn(exclusive=True, candidate=False), self.findings.timed("ref_timing"):
                try:
                    stats, overhead, resolution = self.time_reference()
                    compiled = None
                    if options.compile_baseline:
                        try:
                            compiled = self.time_reference(compiled=True)[0].median_ms
                        except _ReferenceFailed as exc:
                            self.findings.notes.append(f"torch.compile baseline failed: {exc}")
                except _ReferenceFailed as exc:
                    self.findings.fail(f"reference {exc}")
                    raise Stop from None
            self.ref_timing = self.new_ref_timing = RefTiming(
                ref_ms=stats.median_ms, ref_spread=stats.spread, ref_compiled_ms=compiled,
                samples=stats.samples, overhead_ms=overhead, resolution_ms=resolution)
        else:
            self.findings.verdict.ref_cached = True

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

    def _reference_call(self) -> float:
        """One timed call of the reference on fresh inputs, between the candidate's."""
        done, ms = self.exchange.timed(self.exchange.reference, self.inputs.trial())
        if done.error:
            self.findings.fail(f"timing the reference beside the candidate failed: {done.error} "
                               "(the reference, not the candidate)")
            raise Stop
        return ms

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
                samples, overhead, beside = self._timed_calls(pool, ref_error_norms, shipments)
            with findings.timed("timed_checks"):
                for shipment in shipments:
                    checks.compare_shipped(shipment)
        finally:
            for shipment in shipments:
                shipment.close()
        self._write_times(cuda, samples, overhead, beside)

    def _timed_calls(self, pool: list[_Pooled], ref_error_norms: list[float],
                     shipments: list[Shipment]) -> tuple[list[float], float, list[float]]:
        """The candidate's timed calls on the pooled trials, each followed by a call of nothing,
        and the reference's calls beside them: (samples, overhead, reference's samples) in ms.
        The outputs of the calls picked for a full comparison are shipped into `shipments`."""
        options, findings = self.options, self.findings
        exchange, checks = self.exchange, self.checks
        count = len(pool)
        checked = self.inputs.pick(range(options.warmup, count),
                                   min(options.checked_timed_trials, options.timing_trials))
        samples: list[float] = []
        nothing: list[float] = []
        beside: list[float] = []
        after_warmup = range(options.warmup, count)
        step = max(1, -(-len(after_warmup) // max(options.ref_beside_trials, 1)))
        ref_indices = set(after_warmup[::step]) if options.ref_beside_trials > 0 else set()
        for index, pooled in enumerate(pool):
            done, ms = exchange.timed(exchange.candidate, pooled.trial)
            what = f"timed call {index}"
            if done.error:
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
            # A call of nothing in the reference runner after each timed call: the overhead
            # the candidate's times include, measured beside them, where the candidate's
            # process cannot slow it down.
            idle = self.nothing()
            if index >= options.warmup:
                samples.append(ms)
                nothing.append(idle)
            if index in ref_indices:
                beside.append(self._reference_call())
        overhead, self.resolution_ms = self.overhead_of(nothing)
        return samples, overhead, beside

    def _write_times(self, cuda: bool, samples: list[float], overhead: float,
                     beside: list[float]) -> None:
        """The verdict's times and speedup from the timed calls (see "Timing" in the docs)."""
        options, findings, verdict = self.options, self.findings, self.findings.verdict
        ref = self.ref_timing
        # Capped at what the calls of nothing took beside the reference's own timing, when no
        # candidate code existed: a candidate that keeps the host or the GPU busy between its
        # calls would slow these calls of nothing, and so have more subtracted from its own time.
        cap = ref.overhead_ms + ref.resolution_ms
        if overhead > cap:
            # Said in the verdict: the gap between the two is time the candidate is charged for
            # that its calls themselves may not have taken (docs/evaluation.md, "Timing").
            findings.notes.append(f"the calls of nothing beside the candidate took {overhead:.4f} ms "
                                  f"(median); {cap:.4f} ms was subtracted, what they took beside "
                                  "the reference's own timing plus its spread")
            overhead = cap
        # One resolution for both times: the coarser of the two measurements'. A time below it
        # is counted as it, so no speedup is claimed that the noise of either could have made.
        resolution = max(self.resolution_ms, ref.resolution_ms)
        stats = net(samples, overhead, resolution)
        # The reference as timed beside the candidate (same load, same overhead) where that is
        # less than its cached timing, taken at another time: a host busier then than now would
        # otherwise inflate the speedup (or make a slow candidate look fast). Never more than the
        # cached timing, taken before any candidate code existed: a candidate that slows the
        # reference's calls between its own gains nothing.
        ref_ms = ref.ref_ms
        if beside:
            now_ms = statistics.median(beside) - overhead
            if now_ms < ref_ms:
                findings.notes.append(f"the reference timed beside the candidate: {now_ms:.4f} ms "
                                      f"(its cached timing: {ref_ms:.4f} ms)")
                ref_ms = now_ms
        ref_ms = max(ref_ms, resolution)
        verdict.ref_ms, verdict.ref_compiled_ms = ref_ms, ref.ref_compiled_ms
        verdict.candidate_ms = stats.median_ms
        verdict.spread = stats.spread
        verdict.overhead_ms = round(overhead, 6)
        verdict.speedup = ref_ms / stats.median_ms
        for what, ms in (("the candidate's", stats.median_ms), ("the reference's", ref_ms)):
            if ms <= resolution:
                findings.notes.append(f"{what} time is at or below what the judge resolves here "
                                      f"({resolution:.4f} ms, the spread of the calls of nothing): "
                                      "counted as that")
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
        # Below half the floor by more than the judge resolves. The subtracted overhead is
        # measured in the reference's process, not the candidate's, and the two differ by more
        # than the calls of nothing's spread: an honest Triton sum over 1 GB read 0.169 ms against
        # a floor of 0.306 ms on an H100 shared by four workers. Work skipped is caught by the
        # digests; this flag is for times no device of the kind reaches.
        if candidate_ms + resolution_ms < FLOOR_MARGIN * floor:
            self.findings.flag(f"beyond-floor: {candidate_ms:.4f} ms is below half the physical floor "
                               f"{floor:.4f} ms ({loaded.input_bytes + loaded.param_bytes} bytes"
                               + (f", {loaded.flops} flops" if loaded.flops else "")
                               + f" on {device_name})")
