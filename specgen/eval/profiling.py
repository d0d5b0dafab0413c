"""The judge's timing (eval/judge.py; docs/evaluation.md, "Timing"): the reference's timings, the
candidate's timed calls, the speedup, and the physical floor no honest time goes below.

The reference is timed twice before any candidate code runs anywhere: in the reference runner
(its own timing, cached per problem) and in the candidate's runner before the candidate's module
is loaded there (the timing the candidate is measured against: the same process). A timed call is
one window of the judge's (eval/exchange.py, eval/timing.py): from handing its inputs over to the
reply, less a call of nothing measured the same way in the same runner before any candidate code
was loaded there. Every timed call of the candidate's is read and judged by the reference runner
(eval/output_checks.py) as it returns; a few, drawn after the call, in full.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

from specgen.eval.exchange import Exchange
from specgen.eval.findings import Findings, Stop
from specgen.eval.floor import floor_ms
from specgen.eval.inputs import Inputs
from specgen.eval.output_checks import OutputChecks
from specgen.eval.runner_process import Runner
from specgen.eval.timing import MIN_MS, TimingStats, net, resolution
from specgen.messages import EvalOptions, LoadProblem, ProblemLoaded, RefTiming, RunnerReady


FLOOR_MARGIN = 0.5          # beyond-floor: under this share of the physical floor


class _ReferenceFailed(Exception):
    pass


def _ref_timing(stats: TimingStats, overhead_ms: float, resolution_ms: float,
                compiled_ms: float | None) -> RefTiming:
    return RefTiming(ref_ms=stats.median_ms, ref_spread=stats.spread, ref_compiled_ms=compiled_ms,
                     samples=stats.samples, overhead_ms=overhead_ms, resolution_ms=resolution_ms)


class Profiler:
    """The timing of one evaluation. `ref_timing` is the reference's (cached, or measured here:
    then `new_ref_timing` holds it for the cache)."""

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

    def _enough(self, samples: int, began: float) -> bool:
        """Whether a model's timed calls can stop: EvalOptions.timing_budget_s spent on them and
        at least min_timing_trials made (a call of a GB-sized problem takes tens of ms with its
        handover and reading; fifty of them are seconds a verdict)."""
        options = self.options
        return (samples >= options.min_timing_trials
                and time.monotonic() - began >= options.timing_budget_s)

    # ------------------------------------------------------------------ the reference
    def _timed(self, runner: Runner, **flags: Any) -> tuple[str | None, float]:
        """One timed call of the reference (or of nothing) in `runner` (in a candidate's runner:
        Call.reference): its error, its window."""
        if runner is self.exchange.candidate and not flags.get("null"):
            flags["reference"] = True
        done, window = self.exchange.timed(runner, self.inputs.seed(), self.inputs.seed(), **flags)
        if window is None:
            return done.error or "its outputs could not be read", 0.0
        return None, window

    def nothing(self, runner: Runner) -> float:
        """One timed call of nothing in `runner`: the same path (the inputs handed over, tensors
        shaped like the reference's outputs copied into the arena, the reply) with no call."""
        error, window = self._timed(runner, null=True)
        if error:
            self.findings.fail(f"the overhead could not be measured: {error}")
            raise Stop
        return window

    def time_reference(self, runner: Runner, trials: int, compiled: bool = False
                       ) -> tuple[TimingStats, float, float]:
        """The reference's timed calls in `runner` (fresh inputs each), each followed by a call of
        nothing, the calls of nothing topped up to EvalOptions.overhead_trials (at most `trials`):
        (its times, the overhead, the resolution). The first call is untimed: what a call of
        nothing copies is shaped like its outputs."""
        options = self.options
        calls: list[float] = []
        nothing: list[float] = []
        began = time.monotonic()
        for index in range(options.warmup + trials + 1):
            if self._enough(len(calls), began):
                break
            error, window = self._timed(runner, compiled=compiled)
            if error:
                what = "torch.compile(Model)" if compiled else "the reference"
                raise _ReferenceFailed(f"timing {what} failed: {error}")
            idle = self.nothing(runner)
            if index > options.warmup:
                calls.append(window)
                nothing.append(idle)
        while len(nothing) < max(min(options.overhead_trials, trials), 3):
            nothing.append(self.nothing(runner))
        overhead = statistics.median(nothing)
        res = resolution(nothing)
        return net(calls, overhead, res), overhead, res

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
        yet, so its calls of nothing are trusted: the overhead taken off the candidate's windows
        comes from here."""
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

    def _reference_call(self) -> float | None:
        """One timed call of the problem's Model on fresh inputs in the candidate's runner,
        between the candidate's calls: the same process, under the same load. None if it failed
        there (a note says why): the candidate's process may have broken it."""
        error, window = self._timed(self.exchange.candidate)
        if error:
            self.findings.notes.append(f"the reference could not be timed in the candidate's "
                                       f"runner: {error}")
            return None
        return window

    # ------------------------------------------------------------------ the candidate
    def profile(self, cuda: bool) -> None:
        """Time the candidate (its reference timing measured or cached already) and write the
        times and the speedup into the verdict. Only the timed calls, their readings and what is
        timed beside them hold the GPU's exclusive turn (eval/device_turns.py)."""
        with self.exchange.turn(exclusive=True), self.findings.timed("timing"):
            samples, beside = self._timed_calls()
        self._write_times(cuda, samples, beside)

    def _timed_calls(self) -> tuple[list[float], list[float]]:
        """The candidate's timed calls, each read and judged by the reference runner as it
        returns (a few, drawn after the call, in full), and the reference's calls between them in
        the candidate's runner: (the candidate's windows, the reference's)."""
        options, exchange, checks = self.options, self.exchange, self.checks
        count = options.warmup + options.timing_trials
        # Drawn among the calls made whatever the budget (the first min_timing_trials).
        surely = range(options.warmup, min(count, options.warmup + options.min_timing_trials))
        checked = self.inputs.pick(surely, min(options.checked_timed_trials, len(surely)))
        samples: list[float] = []
        beside: list[float] = []
        after_warmup = range(options.warmup, count)
        step = max(1, -(-len(after_warmup) // max(options.ref_beside_trials, 1)))
        ref_indices = set(after_warmup[::step]) if options.ref_beside_trials > 0 else set()
        began = time.monotonic()
        for index in range(count):
            if self._enough(len(samples), began):
                break
            done, window = exchange.timed(exchange.candidate, self.inputs.seed(),
                                          self.inputs.seed())
            what = f"timed call {index}"
            checks.called(done, what)               # stops where there is no window
            assert window is not None
            read = exchange.read(done, index in checked, options.atol, options.rtol)
            checks.judged(done, read, what)
            if index >= options.warmup:
                samples.append(window)
            if index in ref_indices:
                ref_window = self._reference_call()
                if ref_window is None:
                    ref_indices = set()
                else:
                    beside.append(ref_window)
        return samples, beside

    def _write_times(self, cuda: bool, samples: list[float], beside: list[float]) -> None:
        """The verdict's times and speedup from the timed calls (see "Timing" in the docs)."""
        options, findings, verdict = self.options, self.findings, self.findings.verdict
        # Measured as the reference was: less the overhead of a call of nothing timed before any
        # candidate code was loaded in this process (Profiler.measure_local; without it, in the
        # reference runner), which the candidate cannot change. One resolution for both times,
        # the reference's: a time below it is counted as it, so no speedup is claimed that the
        # noise could have made.
        ref = self.local or self.ref_timing
        assert ref is not None
        res = self.resolution_ms = max(ref.resolution_ms, MIN_MS)
        stats = net(samples, ref.overhead_ms, res)
        # The reference as timed between the candidate's calls, where that is less: the same
        # process, now under the load of the candidate's calls (a host busier then than now
        # would otherwise make a candidate look faster than it is). Never more: the candidate's
        # code could slow these calls, and then gains nothing.
        ref_ms = ref.ref_ms
        if beside:
            now_ms = statistics.median(beside) - ref.overhead_ms
            if now_ms < ref_ms:
                findings.notes.append(f"the reference timed between the candidate's calls: "
                                      f"{now_ms:.4f} ms (before them: {ref_ms:.4f} ms)")
                ref_ms = now_ms
        ref_ms = max(ref_ms, res)
        verdict.ref_ms = ref_ms
        verdict.ref_compiled_ms = self.ref_timing.ref_compiled_ms if self.ref_timing else None
        verdict.candidate_ms = stats.median_ms
        verdict.spread = stats.spread
        verdict.overhead_ms = round(ref.overhead_ms, 6)
        verdict.speedup = ref_ms / stats.median_ms
        for what, ms in (("the candidate's", stats.median_ms), ("the reference's", ref_ms)):
            if ms <= res:
                findings.notes.append(f"{what} time is at or below what the judge resolves here "
                                      f"({res:.4f} ms, the spread of a call of nothing): "
                                      "counted as that")
        if cuda and options.floor_check:
            self._floor(stats.median_ms, res)

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
