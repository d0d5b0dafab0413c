"""The judge: one candidate's verdict, made in the worker's process from nothing the candidate's
process can forge.

Three processes take part (docs/evaluation.md, "The judge"):

* the **judge** (this module, in the worker): draws every seed (inputs and digest signs) fresh
  and unpredictable per call, decides which outputs to compare in full (after the call), measures
  every time on its own clock, writes the verdict. It runs no problem or candidate code.
* the **reference runner**: runs the problem's code only; owns the arena (eval/arena.py): makes
  every call's inputs and hands them over there, reads every call's outputs there itself and
  judges them against its own call and the accurate value; times the reference.
* the **candidate runner**: maps the arena, calls its model on the inputs there when told and
  leaves its outputs there. Whatever it replies is never a verdict field: where it says its
  outputs lie only tells the reference runner where to read, and a time is never taken from it.

`Judge` runs the stages; its parts each own one idea: the verdict as it is written
(eval/findings.py), the seeds (eval/inputs.py), the requests to the two runners
(eval/exchange.py), the checks of the candidate's calls (eval/output_checks.py), the probes
beyond the plain trials (eval/probes.py), the timing of both sides (eval/profiling.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from specgen.eval.device_turns import DeviceTurns
from specgen.eval.exchange import Exchange
from specgen.eval.findings import Findings, Stop
from specgen.eval.inputs import Inputs
from specgen.eval.loader import CandidateSource, ProblemSource
from specgen.eval.output_checks import OutputChecks
from specgen.eval.probes import Probes
from specgen.eval.profiling import Profiler
from specgen.eval.runner_process import Runner
from specgen.messages import (BuildRecord, BuildResult, EvalOptions, LoadCandidate, LoadProblem,
                              ProblemLoaded, RefTiming, RunnerReady, Verdict)


@dataclass
class ProblemState:
    """A problem as its reference runner holds it."""

    source: ProblemSource
    load: LoadProblem                   # what the runner was loaded with (its init seed)
    loaded: ProblemLoaded               # what it found
    ready: RunnerReady


class Judge:
    """One evaluation (see the module doc). `run(stage)` returns the verdict."""

    def __init__(self, options: EvalOptions, device: str, reference: Runner, candidate: Runner,
                 problem: ProblemState, candidate_source: CandidateSource,
                 ref_timing: RefTiming | None, build: BuildResult | None,
                 cancelled: Callable[[], bool], turns: DeviceTurns | None = None) -> None:
        self.options = options
        self.device = device
        self.cuda = device.startswith("cuda")
        self.problem = problem
        self.candidate_source = candidate_source
        self.build = build
        self.candidate_builds: list[BuildRecord] = []
        self.inputs = Inputs(options.seed)
        self.findings = Findings(device, self.cuda)
        self.exchange = Exchange(self.findings, reference, candidate, options.timeout_s, cancelled,
                                 turns)
        self.checks = OutputChecks(self.findings, self.exchange, self.inputs, options)
        self.probes = Probes(self.findings, self.exchange, self.checks, options, problem.loaded)
        self.profiler = Profiler(self.findings, self.inputs, self.exchange, self.checks, options,
                                 problem.loaded, problem.ready, ref_timing)

    @property
    def new_ref_timing(self) -> RefTiming | None:
        """The reference's timing when this evaluation measured it (for the cache), else None."""
        return self.profiler.new_ref_timing

    # ------------------------------------------------------------------ the flow
    def run(self, stage: str) -> Verdict:
        began = time.monotonic()
        try:
            self._run(stage)
        except Stop:
            pass
        return self.findings.finish(stage, began)

    def _run(self, stage: str) -> None:
        findings = self.findings
        loaded = self.problem.loaded
        with findings.timed("arena"):
            self.exchange.make_arena(loaded.input_bytes, loaded.output_bytes)
        if stage in ("profile", "full"):
            # The reference is timed before the candidate's code exists anywhere, so that a
            # candidate's busy thread or GPU kernel cannot slow it (inflating its speedup): in
            # the reference runner, and in the candidate's runner before its module is loaded.
            self.profiler.measure_reference()
            self.profiler.measure_local(self.problem.load)
        with findings.timed("load"):
            self._load()
        if stage in ("validate", "full"):
            with findings.timed("correctness"):
                for trial in range(self.options.trials):
                    self.checks.checked(f"trial {trial}")
            with findings.timed("guards"):
                self.probes.run()
            self.probes.kernels_ran(self.candidate_source, self.candidate_builds, self.device)
        else:
            with findings.timed("correctness"):
                self.checks.checked("the check before timing")
        findings.verdict.correct = findings.clean()
        if stage in ("profile", "full") and findings.verdict.correct:
            self.profiler.profile(self.cuda)
            findings.verdict.correct = findings.clean()

    def _load(self) -> None:
        request = LoadCandidate(problem=self.problem.load,
                                candidate_source=self.candidate_source.text,
                                cache_dir=self.options.cache_dir or "")
        loaded: ProblemLoaded = self.exchange.ask(self.exchange.candidate, request,
                                                  ProblemLoaded).message
        failed = [b for b in (self.build.records if self.build else []) if not b.ok]
        if loaded.error:
            extra = "".join(f"; extension {b.name} failed to build: {b.error}" for b in failed
                            if b.error and b.error not in loaded.error)
            self.findings.fail(loaded.error + extra)
            raise Stop
        self.findings.verdict.compiled = True
        self.candidate_builds = list(loaded.builds) + failed
