"""The judge: one candidate's verdict, made in the worker's process from nothing the candidate's
process can forge.

Three processes take part (docs/evaluation.md, "The judge"):

* the **judge** (this module, in the worker): draws every seed (inputs and digest weights) fresh
  and unpredictable per call, decides which outputs to compare in full, measures every time on
  its own clock, compares digests, writes the verdict. It runs no problem or candidate code.
* the **reference runner**: runs the problem's code only; computes the accurate reference value
  of any call and compares a candidate's output with it; times the reference.
* the **candidate runner**: runs a call when told (inputs from the judge's seed, the call, the
  digest) and copies its output into a buffer when told. Whatever it replies is evidence to
  check, never a verdict field: a digest is believed only if it matches the reference's, an
  output only if the reference finds it right, a time is never taken from it.

A trial's time is from the judge sending the request (one packet; the runner cannot have it
sooner) to the kernel's timestamp on the reply (the runner cannot send it before the digest,
which needs the whole output). The same path timed with no call at all (the overhead: making
the inputs, drawing the weights, the digest, both messages) is measured in the reference runner
and subtracted from the reference's and the candidate's medians alike.
"""
from __future__ import annotations

import contextlib
import math
import os
import random
import secrets
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from specgen.eval.device_turns import DeviceTurns
from specgen.eval.floor import floor_ms
from specgen.eval.loader import CandidateSource, ProblemSource
from specgen.eval.runner_process import Runner
from specgen.eval.timing import TimingStats, summarize
from specgen.messages import (BuildResult, Compare, Compared, EvalOptions, LoadCandidate,
                              LoadProblem, OutputMeta, ParamsSet, ProblemLoaded, RefTiming,
                              RunnerReady, SetParams, Ship, Shipped, Trial, TrialDone, Verdict)

DIGEST_SIGMAS = 6.0             # a right output's digest misses by more than this 2e-9 of the time
_MIN_MS = 1e-3                  # 1 us: no finer time is claimed, whatever the overhead's spread


class _Stop(Exception):
    """The evaluation cannot go on (the verdict already says why)."""


def _memfd(size: int) -> int:
    """A sealed shared buffer of `size` bytes (pages exist only once written)."""
    import fcntl

    fd = os.memfd_create("specgen-outputs", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, max(size, 1))
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd


def other_size(value: int) -> int:
    """A different size of the same kind: 3/4 of it (kept even), or one more when small."""
    if value < 4:
        return value + 1
    other = (value * 3) // 4
    if value % 2 == 0 and other % 2:
        other += 1
    return other if other != value else value + 2


def digest_bound(tol_norm: float, ref_error_norm: float, reference: float) -> float:
    """How far a right output's digest may be from the reference's.

    With W standard normal and e = output - reference independent of W, sum(e x W) is normal
    with deviation |e|; a right output has |e| <= |tolerance| + |reference error|. (The runner
    computes the digest, so the candidate's process can know W; to match the reference's digest
    with a wrong output it would still need the reference's digest, which only the right output
    gives it.)"""
    return DIGEST_SIGMAS * (tol_norm + ref_error_norm) + 1e-9 * abs(reference) + 1e-12


@dataclass
class ProblemState:
    """A problem as its reference runner holds it."""

    source: ProblemSource
    load: LoadProblem                   # what the runner was loaded with (its init seed)
    loaded: ProblemLoaded               # what it found
    ready: RunnerReady
    ref_error_norms: list[float] = field(default_factory=list)   # largest seen, per output


@dataclass
class _Pooled:
    trial: Trial
    digests: list[float]
    tol_norms: list[float]
    input_digests: list[float]


class Judge:
    """One evaluation (see the module doc). `run(stage)` returns the verdict."""

    def __init__(self, options: EvalOptions, device: str, reference: Runner, candidate: Runner,
                 problem: ProblemState, candidate_source: CandidateSource,
                 ref_timing: RefTiming | None, build: BuildResult | None,
                 cancelled: Callable[[], bool], turns: DeviceTurns | None = None) -> None:
        self.options = options
        self.device = device
        self.cuda = device.startswith("cuda")
        self.reference = reference
        self.candidate = candidate
        self.problem = problem
        self.candidate_source = candidate_source
        self.ref_timing = ref_timing
        self.new_ref_timing: RefTiming | None = None
        self.build = build
        self.cancelled = cancelled
        self.rng = random.Random(options.seed) if options.seed is not None else \
            random.SystemRandom()
        self.verdict = Verdict(device=device, cpu_timing=not self.cuda)
        self.flags: dict[str, str] = {}
        self.notes: list[str] = []
        self.seconds: dict[str, float] = {}
        self.deadline = time.monotonic() + options.timeout_s
        self.launches = 0
        self.compared = False
        self.max_abs = self.max_rel = 0.0
        self.index = 0
        self.overhead_ms = 0.0
        self.reference_mutates = False
        self.resolution_ms = _MIN_MS
        self._buffer_fd: int | None = None
        self._buffer_size = 0
        # Workers sharing the GPU take turns (device_turns): between this judge's requests its
        # candidate runner is stopped, so nothing of it runs beside another worker's timing.
        self.turns = turns or DeviceTurns("cpu")
        self._candidate_running = not self.turns.active
        if self.turns.active:
            candidate.pause()

    # ------------------------------------------------------------------ helpers
    def seed(self) -> int:
        return self.rng.randrange(1, 2**62)

    def trial(self, **fields: Any) -> Trial:
        self.index += 1
        return Trial(index=self.index, seed=self.seed(), digest_seed=self.seed(), **fields)

    def fail(self, error: str) -> None:
        if self.verdict.error is None:
            self.verdict.error = error[:4000]

    def flag(self, flag: str) -> None:
        self.flags.setdefault(flag.split(":", 1)[0], flag[:1000])

    def _timed(self, key: str) -> "_Clock":
        return _Clock(self.seconds, key)

    @contextlib.contextmanager
    def _turn(self, exclusive: bool = False, candidate: bool = True) -> Iterator[None]:
        """A request (shared) or a timing (exclusive) on a GPU other workers may share, with the
        candidate runner let run for it when `candidate`."""
        began = time.perf_counter()
        with self.turns.exclusive() if exclusive else self.turns.shared():
            self.seconds["turn_wait"] = self.seconds.get("turn_wait", 0.0) + \
                time.perf_counter() - began
            outer = candidate and not self._candidate_running
            if outer:
                self.candidate.resume()
                self._candidate_running = True
            try:
                yield
            finally:
                if outer:
                    self.candidate.pause()
                    self._candidate_running = False

    def _ask(self, runner: Runner, message: Any, expect: type, fds: tuple[int, ...] = ()
             ) -> Any:
        """Send one request and return its reply, or stop: the verdict says why (and whose)."""
        with self._turn(candidate=runner is self.candidate):
            received, why = runner.request(message, self.deadline, self._timeout_setting(),
                                           self.cancelled, fds)
        if received is None:
            self._no_reply(runner, why)
        if not isinstance(received.message, expect):
            runner.kill()
            self.fail(f"the {runner.role} runner answered {type(received.message).__name__} to "
                      f"{type(message).__name__}")
            raise _Stop
        return received

    def _timeout_setting(self) -> str:
        return f"EvalOptions.timeout_s = {self.options.timeout_s:g} s"

    def _no_reply(self, runner: Runner, why: str | None, when: str = "") -> None:
        """Stop for a request that got no reply: the verdict says why, and whose fault it was.
        A runner killed by a cancel reads as cancelled, not as a death."""
        if why == "cancelled" or self.cancelled():
            self.verdict.error, self.verdict.code = "cancelled", "cancelled"
        elif runner.role == "reference":
            self.fail(f"the reference runner failed: {why}{when} (the reference, not the "
                      "candidate)")
            self.verdict.code = self.verdict.code or "reference"
        elif why is not None and why.startswith("the candidate runner"):
            self.fail(f"{why}{when}")
        else:
            self.fail(f"candidate {why}{when}")
            if why is not None and why.startswith("timed out"):
                self.verdict.code = self.verdict.code or "timeout"
        raise _Stop

    def _buffer(self, nbytes: int) -> int:
        if self._buffer_fd is None or nbytes > self._buffer_size:
            if self._buffer_fd is not None:
                os.close(self._buffer_fd)
            self._buffer_size = max(nbytes, 1 << 20)
            self._buffer_fd = _memfd(self._buffer_size)
        return self._buffer_fd

    def close(self) -> None:
        if self._buffer_fd is not None:
            os.close(self._buffer_fd)
            self._buffer_fd = None

    # ------------------------------------------------------------------ the flow
    def run(self, stage: str) -> Verdict:
        began = time.monotonic()
        try:
            self._run(stage)
        except _Stop:
            pass
        finally:
            self.close()
        v = self.verdict
        v.stage = stage
        v.flags = list(self.flags.values())
        if self.compared:
            v.max_abs_error, v.max_rel_error = self.max_abs, self.max_rel
        if v.flags or v.error:
            v.correct = False
        v.notes = self.notes
        self.seconds["judge"] = time.monotonic() - began
        v.stage_seconds = {k: round(s, 4) for k, s in self.seconds.items()}
        return v

    def _run(self, stage: str) -> None:
        if stage in ("profile", "full"):
            # The reference's own timing is measured before the candidate's code exists
            # anywhere: a candidate's busy thread or GPU kernel cannot slow the reference
            # (inflating its speedup). The overhead subtracted from the candidate's times is
            # measured beside them, and capped at this measurement's (see _profile).
            self._measure_reference()
        with self._timed("load"):
            self._load()
        if stage in ("validate", "full"):
            with self._timed("correctness"):
                for trial in range(self.options.trials):
                    self.checked(self.trial(), f"trial {trial}")
            with self._timed("guards"):
                self._probes()
            self._kernels_ran()
        else:
            with self._timed("correctness"):
                self.checked(self.trial(), "the check before timing")
        self.verdict.correct = not self.flags and self.verdict.error is None
        if stage in ("profile", "full") and self.verdict.correct:
            self._profile()
            self.verdict.correct = not self.flags and self.verdict.error is None

    def _load(self) -> None:
        request = LoadCandidate(problem=self.problem.load,
                                candidate_source=self.candidate_source.text,
                                cache_dir=self.options.cache_dir or "")
        loaded: ProblemLoaded = self._ask(self.candidate, request, ProblemLoaded).message
        failed = [b for b in (self.build.records if self.build else []) if not b.ok]
        if loaded.error:
            extra = "".join(f"; extension {b.name} failed to build: {b.error}" for b in failed
                            if b.error and b.error not in loaded.error)
            self.fail(loaded.error + extra)
            raise _Stop
        self.verdict.compiled = True
        self.candidate_builds = list(loaded.builds) + failed

    # ------------------------------------------------------------------ one checked call
    def call(self, trial: Trial, what: str, error_flag: str | None = None) -> TrialDone | None:
        """The candidate's call of `trial`; its error stops the evaluation (or, with
        `error_flag`, becomes that flag and None)."""
        first = "first_call" not in self.seconds
        began = time.monotonic()
        done: TrialDone = self._ask(self.candidate, trial, TrialDone).message
        if first:
            # The first call compiles Triton kernels (JIT): reported apart as compile time.
            self.seconds["first_call"] = time.monotonic() - began
        self.launches += done.launches
        if done.index != trial.index:
            self.fail(f"the candidate's runner answered trial {done.index} to trial {trial.index}")
            raise _Stop
        if done.error:
            if error_flag is not None:
                self.flag(f"{error_flag}: ModelNew raised on {what}: {done.error[:300]}")
                return None
            self.fail(f"{done.error} ({what})")
            raise _Stop
        if done.kernel_errors:
            self.flag(f"kernel-error-fallback: its kernel raised on {what} and the call still "
                      f"returned: {done.kernel_errors[0]}")
        for meta in done.outputs:
            if meta.kind == "tensor" and not meta.plain:
                self.flag(f"tensor-subclass: returned a tensor subclass on {what}")
        return done

    def checked(self, trial: Trial, what: str, mismatch_flag: str | None = None) -> bool:
        """Run `trial` on the candidate, compare its whole output with the reference's accurate
        value and its digest with the reference's. False (and the verdict says why, or the flag
        `mismatch_flag` when given, also for a call that raised) when they differ."""
        code = mismatch_flag.split(":", 1)[0] if mismatch_flag else None
        done = self.call(trial, what, error_flag=code)
        if done is None:
            return False
        tensors = [m for m in done.outputs if m.kind == "tensor"]
        slots_size = sum((m.nbytes + 63) // 64 * 64 for m in tensors)
        buffer = self._buffer(slots_size)
        shipped: Shipped = self._ask(self.candidate, Ship(index=trial.index), Shipped,
                                     (buffer,)).message
        if shipped.error:
            self.fail(f"the candidate's output could not be read ({what}): {shipped.error}")
            raise _Stop
        compared: Compared = self._ask(
            self.reference, Compare(trial=trial, slots=shipped.slots, atol=self.options.atol,
                                    rtol=self.options.rtol), Compared, (buffer,)).message
        if compared.problem_error:
            self.fail(f"{compared.problem_error} ({what}; the reference, not the candidate)")
            raise _Stop
        if compared.accurate and not any(n.startswith("accurate reference") for n in self.notes):
            self.notes.append(f"accurate reference: {compared.accurate}")
        self.compared = True
        self.max_abs = max(self.max_abs, compared.max_abs)
        self.max_rel = max(self.max_rel, compared.max_rel)
        reason = compared.reason if not compared.ok else None
        if reason is None:
            reason = self._numbers_differ(done.outputs, compared.outputs)
        if reason is None:
            reason = self._digests_differ(done.digests, compared.digests, compared.tol_norms,
                                          compared.ref_error_norms, what)
        if reason is None:
            if not trial.shape and not trial.refill_seed:
                self._keep_ref_error(compared.ref_error_norms)
            self.reference_mutates = self.reference_mutates or compared.reference_mutates
            if not compared.reference_mutates and trial.refill_seed is None:
                self._inputs_unchanged(done.input_digests, compared.input_digests, what)
            return True
        if mismatch_flag is None:
            self.fail(f"{reason} ({what})")
            raise _Stop
        self.flag(f"{mismatch_flag} ({reason})")
        return False

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

    def _digests_differ(self, cand: list[float], ref: list[float], tol_norms: list[float],
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

    def _inputs_unchanged(self, cand: list[float], ref: list[float], what: str) -> None:
        """The call left its inputs as the reference's call leaves them (both digested alike on
        the same values: equal to the last bits but for the order of the sum)."""
        if len(cand) != len(ref) or any(
                not math.isfinite(c) or abs(c - r) > 1e-9 * (abs(r) + 1.0)
                for c, r in zip(cand, ref)):
            self.flag(f"mutated-inputs: the call changed its input tensors on {what}, which the "
                      "problem's Model does not do")

    def _keep_ref_error(self, norms: list[float]) -> None:
        kept = self.problem.ref_error_norms
        if len(kept) != len(norms):
            kept[:] = list(norms)
        else:
            kept[:] = [max(a, b) for a, b in zip(kept, norms)]

    # ------------------------------------------------------------------ probes
    def _probes(self) -> None:
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
        if self.problem.loaded.input_bytes == 0:
            self.notes.append("memoization probe skipped: no tensor inputs")
            return
        trial = self.trial(refill_seed=self.seed())
        self.checked(trial, "inputs refilled in place",
                     mismatch_flag="memoized: the output did not follow its inputs refilled in "
                                   "place (a result cached by data pointer, shape or call)")

    def _second_shape(self) -> None:
        constants = self.problem.loaded.shape_constants
        if not constants:
            self.notes.append("second shape skipped: no module constant is read only by "
                              "get_inputs()")
            return
        changed = {name: other_size(value) for name, value in constants.items()}
        what = "second shape " + ", ".join(f"{k}={v}" for k, v in changed.items())
        probe = self.trial(shape=changed)
        done: TrialDone = self._ask(self.reference, probe, TrialDone).message
        if done.error:
            self.notes.append(f"second shape skipped: the reference rejects {what}")
            return
        self.checked(self.trial(shape=changed), what,
                     mismatch_flag=f"hard-coded-shape: wrong on {what}")

    def _randomized_params(self) -> None:
        params = self.problem.loaded.params
        if not params:
            return
        seed = self.seed()
        result: ParamsSet = self._ask(self.candidate, SetParams(seed=seed, reference=params),
                                      ParamsSet).message
        if result.error:
            if result.error.startswith("parameter-mismatch"):
                self.flag(result.error)
            else:
                self.notes.append(f"randomized-parameter trial skipped: {result.error}")
            return
        self._ask(self.reference, SetParams(seed=seed), ParamsSet)
        try:
            self.checked(self.trial(), "randomized parameters",
                         mismatch_flag="initial-params-only: with random parameter values loaded "
                                       "into both models the outputs differ")
        finally:
            # The reference runner serves later candidates: its parameters go back, always.
            self._ask(self.reference, SetParams(seed=None), ParamsSet)
        self._ask(self.candidate, SetParams(seed=None, reference=params), ParamsSet)

    def _kernels_ran(self) -> None:
        """A candidate that defines kernels must have run one (a fallback that ran is flagged; a
        fallback written but never taken is not)."""
        failed = [b for b in self.candidate_builds if not b.ok]
        if failed:
            self.flag(f"custom-kernel-not-run: extension {failed[0].name} failed to build "
                      f"({(failed[0].error or '')[:300]}) and the candidate ran without it")
        elif self.candidate_source.claims_custom_kernels and self.launches == 0:
            host_only = [b.name for b in self.candidate_builds if not b.device_code]
            if host_only and self.device.startswith("cuda"):
                self.flag(f"custom-kernel-not-run: extension {host_only[0]} has no device code "
                          "(no cuda_sources, no __global__ function): on the GPU it only calls "
                          "library kernels")
                return
            kinds = " and ".join(self.candidate_source.kernel_kinds)
            self.flag(f"custom-kernel-not-run: the candidate defines {kinds} kernels but none "
                      "of them ran")

    # ------------------------------------------------------------------ timing
    def timed(self, runner: Runner, trial: Trial) -> tuple[TrialDone, float]:
        """One timed call: (reply, milliseconds from the request to the reply's timestamp)."""
        sent = runner.send(trial)
        received, why = runner.receive(self.deadline, self._timeout_setting(), self.cancelled,
                                       kill_on_cancel=runner.role != "reference")
        if received is None:
            self._no_reply(runner, why, " (while timed)")
        if not isinstance(received.message, TrialDone):
            runner.kill()
            self.fail(f"the {runner.role} runner answered {type(received.message).__name__} "
                      "to a timed call")
            raise _Stop
        arrived = received.stamp_ns if received.stamp_ns is not None else \
            time.clock_gettime_ns(time.CLOCK_REALTIME)
        return received.message, (arrived - sent) / 1e6

    def _prime_nothing(self) -> None:
        """One real call in the reference runner: the calls of nothing digest tensors shaped like
        its last outputs."""
        done: TrialDone = self._ask(self.reference, self.trial(), TrialDone).message
        if done.error:
            self.fail(f"{done.error} (the reference, not the candidate)")
            raise _Stop

    def nothing(self) -> float:
        """One timed call of nothing in the reference runner: the same path (inputs made, outputs
        and inputs digested, the reply) with no call. What every call's time includes besides
        the call."""
        done, ms = self.timed(self.reference, self.trial(null=True))
        if done.error:
            self.fail(f"the overhead could not be measured: {done.error}")
            raise _Stop
        return ms

    def overhead_of(self, samples: list[float]) -> tuple[float, float]:
        """(median, p75 - p25) of calls of nothing taken between the timed calls, topped up to
        EvalOptions.overhead_trials: what is subtracted, and how finely the judge resolves."""
        while len(samples) < max(self.options.overhead_trials, 3):
            samples.append(self.nothing())
        stats = summarize(samples)
        return stats.median_ms, max(stats.p75_ms - stats.p25_ms, _MIN_MS)

    def time_reference(self, compiled: bool = False) -> tuple[TimingStats, float, float]:
        """The reference's timed calls (fresh inputs each), each followed by a call of nothing:
        the overhead is measured under the same conditions (clocks, caches) as the calls."""
        count = self.options.warmup + self.options.timing_trials
        self._prime_nothing()
        samples, nothing = [], []
        for index in range(count):
            done, ms = self.timed(self.reference, self.trial(compiled=compiled))
            if done.error:
                what = "torch.compile(Model)" if compiled else "the reference"
                raise _ReferenceFailed(f"timing {what} failed: {done.error}")
            idle = self.nothing()
            if index >= self.options.warmup:
                samples.append(ms)
                nothing.append(idle)
        overhead, resolution = self.overhead_of(nothing)
        return net(samples, overhead, resolution), overhead, resolution

    def _pool(self, count: int) -> list[_Pooled]:
        """The reference's digests of `count` fresh calls, for the candidate's timed calls."""
        pooled = []
        for _ in range(count):
            trial = self.trial()
            done: TrialDone = self._ask(self.reference, Trial(
                index=trial.index, seed=trial.seed, digest_seed=trial.digest_seed, bounds=True),
                TrialDone).message
            if done.error:
                self.fail(f"{done.error} (the reference, not the candidate)")
                raise _Stop
            pooled.append(_Pooled(trial, done.digests, done.tol_norms, done.input_digests))
        return pooled

    def _measure_reference(self) -> None:
        """The reference's timing (unless cached) and the overhead, in the reference runner."""
        options = self.options
        if self.ref_timing is None:
            with self._turn(exclusive=True, candidate=False), self._timed("ref_timing"):
                try:
                    stats, overhead, resolution = self.time_reference()
                    compiled = None
                    if options.compile_baseline:
                        try:
                            compiled = self.time_reference(compiled=True)[0].median_ms
                        except _ReferenceFailed as exc:
                            self.notes.append(f"torch.compile baseline failed: {exc}")
                except _ReferenceFailed as exc:
                    self.fail(f"reference {exc}")
                    raise _Stop from None
            self.ref_timing = self.new_ref_timing = RefTiming(
                ref_ms=stats.median_ms, ref_spread=stats.spread, ref_compiled_ms=compiled,
                samples=stats.samples, overhead_ms=overhead, resolution_ms=resolution)
        else:
            self.verdict.ref_cached = True

    def _profile(self) -> None:
        with self._turn(exclusive=True):
            self._profile_in_turn()

    def _profile_in_turn(self) -> None:
        options = self.options
        count = options.warmup + options.timing_trials
        # The reference's digests of the candidate's timed calls, made now (untimed): the
        # reference answers these without waiting for another request, so that it sleeps, not
        # spins, while the candidate is timed.
        with self._timed("pool"):
            pool = self._pool(count)
        with self._timed("timing"):
            checked = set(self.rng.sample(range(options.warmup, count),
                                          min(options.checked_timed_trials, options.timing_trials)))
            samples, nothing, beside = [], [], []
            after_warmup = range(options.warmup, count)
            step = max(1, -(-len(after_warmup) // max(options.ref_beside_trials, 1)))
            ref_indices = set(after_warmup[::step]) if options.ref_beside_trials > 0 else set()
            for index, pooled in enumerate(pool):
                done, ms = self.timed(self.candidate, pooled.trial)
                what = f"timed call {index}"
                if done.error:
                    self.fail(f"{done.error} ({what})")
                    raise _Stop
                self.launches += done.launches
                reason = self._digests_differ(done.digests, pooled.digests, pooled.tol_norms,
                                              [2 * e for e in self.problem.ref_error_norms], what)
                if reason is not None:
                    self.fail(f"{reason} ({what}: its digest, read as the call returned, is not "
                              "the reference's)")
                    raise _Stop
                if not self.reference_mutates:
                    self._inputs_unchanged(done.input_digests, pooled.input_digests, what)
                if index in checked:
                    self._check_last(pooled.trial, what)
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
        ref = self.ref_timing
        # Capped at what the calls of nothing took beside the reference's own timing, when no
        # candidate code existed: a candidate that keeps the host or the GPU busy between its
        # calls would slow these calls of nothing, and so have more subtracted from its own time.
        overhead = min(overhead, ref.overhead_ms + ref.resolution_ms)
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
                self.notes.append(f"the reference timed beside the candidate: {now_ms:.4f} ms "
                                  f"(its cached timing: {ref_ms:.4f} ms)")
                ref_ms = now_ms
        ref_ms = max(ref_ms, resolution)
        self.verdict.ref_ms, self.verdict.ref_compiled_ms = ref_ms, ref.ref_compiled_ms
        self.verdict.candidate_ms = stats.median_ms
        self.verdict.spread = stats.spread
        self.verdict.overhead_ms = round(overhead, 6)
        self.verdict.speedup = ref_ms / stats.median_ms
        for what, ms in (("the candidate's", stats.median_ms), ("the reference's", ref_ms)):
            if ms <= resolution:
                self.notes.append(f"{what} time is at or below what the judge resolves here "
                                  f"({resolution:.4f} ms, the spread of the calls of nothing): "
                                  "counted as that")
        if self.cuda and options.floor_check:
            self._floor(stats.median_ms, resolution)

    def _reference_call(self) -> float:
        """One timed call of the reference on fresh inputs, between the candidate's."""
        done, ms = self.timed(self.reference, self.trial())
        if done.error:
            self.fail(f"timing the reference beside the candidate failed: {done.error} "
                      "(the reference, not the candidate)")
            raise _Stop
        return ms

    def _check_last(self, trial: Trial, what: str) -> None:
        """The output of the timed call just made, compared in full (chosen unpredictably)."""
        # The candidate still holds it: ship it and let the reference compare.
        received, why = self.candidate.request(Ship(index=trial.index), self.deadline,
                                               "EvalOptions.timeout_s", self.cancelled,
                                               (self._buffer(self._buffer_size),))
        if received is None or not isinstance(received.message, Shipped) or received.message.error:
            self.fail(f"the candidate's output could not be read ({what}): "
                      f"{why or getattr(received.message, 'error', '')}")
            raise _Stop
        compared: Compared = self._ask(
            self.reference, Compare(trial=trial, slots=received.message.slots,
                                    atol=self.options.atol, rtol=self.options.rtol),
            Compared, (self._buffer(self._buffer_size),)).message
        if compared.problem_error:
            self.fail(f"{compared.problem_error} ({what}; the reference, not the candidate)")
            raise _Stop
        if not compared.ok:
            self.fail(f"{compared.reason} ({what})")
            raise _Stop

    def _floor(self, candidate_ms: float, resolution_ms: float) -> None:
        loaded = self.problem.loaded
        floor = floor_ms(loaded.input_bytes + loaded.param_bytes, loaded.flops,
                         self.problem.ready.device_name, loaded.half,
                         self.options.peak_bandwidth_gbs, self.options.peak_tflops)
        if floor is None:
            self.notes.append(f"floor check skipped: no peak figures for "
                              f"{self.problem.ready.device_name}")
            return
        self.verdict.floor_ms = floor
        # Below the floor by more than the judge resolves: a time within the calls of nothing's
        # spread of the floor may be the subtraction's noise, not a cheat.
        if candidate_ms + resolution_ms < floor:
            self.flag(f"beyond-floor: {candidate_ms:.4f} ms is below the physical floor "
                      f"{floor:.4f} ms ({loaded.input_bytes + loaded.param_bytes} bytes"
                      + (f", {loaded.flops} flops" if loaded.flops else "")
                      + f" on {self.problem.ready.device_name})")


def net(samples_ms: list[float], overhead_ms: float, resolution_ms: float) -> TimingStats:
    """The calls' own times: each sample less the overhead; a median below the resolution (the
    overhead's own spread) is counted as the resolution, since nothing finer is measured."""
    stats = summarize([s - overhead_ms for s in samples_ms])
    median = max(stats.median_ms, resolution_ms)
    return TimingStats(median_ms=median, p25_ms=stats.p25_ms, p75_ms=stats.p75_ms,
                       min_ms=stats.min_ms, samples=stats.samples)


class _ReferenceFailed(Exception):
    pass


class _Clock:
    def __init__(self, seconds: dict[str, float], key: str) -> None:
        self.seconds, self.key = seconds, key

    def __enter__(self) -> None:
        self.began = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.seconds[self.key] = self.seconds.get(self.key, 0.0) + time.perf_counter() - self.began


def new_init_seed() -> int:
    return secrets.randbelow(2**31 - 2) + 1
